"""Per-channel rate limiting: a WeCom robot accepts about 20 messages a minute.

Two implementations of one protocol: an in-process sliding window (one worker process, the
embedded mode) and a Redis sorted-set window shared by every worker that talks to the same
Redis. Either way the robot's own refusal (errcode 45009) is still honoured by the delivery
client; the limiter only keeps us from provoking it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from redis.exceptions import RedisError

from app.alerts.errors import AlertError


class RateLimitRefused(AlertError):
    """The limiter did not let this send through now; the caller retries later."""


class RateLimitWaitTooLong(RateLimitRefused):
    """Sending now would need a longer wait than the caller allows."""


class RateLimitUnavailable(RateLimitRefused):
    """The shared limiter (Redis) could not be asked."""


class RateLimiter(Protocol):
    def acquire(self, key: str, *, limit: int, window_s: float, max_wait_s: float = 120.0) -> float:
        """Block until one more send under `key` stays within `limit` per `window_s`.

        Returns the seconds waited; raises `RateLimitWaitTooLong` rather than wait more than
        `max_wait_s` in total.
        """
        ...


def _check(limit: int, window_s: float) -> None:
    if limit < 1 or window_s <= 0:
        raise ValueError(f"rate limit {limit}/{window_s}s must be positive")


class SlidingWindowRateLimiter:
    """In-process sliding window: the (limit+1)-th send waits until the oldest leaves the window."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._sent: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str, *, limit: int, window_s: float, max_wait_s: float = 120.0) -> float:
        _check(limit, window_s)
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                sent = self._sent.setdefault(key, deque())
                while sent and sent[0] <= now - window_s:
                    sent.popleft()
                if len(sent) < limit:
                    sent.append(now)
                    return waited
                pause = sent[0] + window_s - now
            if waited + pause > max_wait_s:
                raise RateLimitWaitTooLong(
                    f"{key}: would wait {waited + pause:.1f} s > {max_wait_s} s"
                )
            self._sleep(pause)
            waited += pause


# Trim the window, then either record this send (returns "0") or say how long until the oldest
# send leaves the window. One script, so concurrent workers cannot both take the last slot.
_ACQUIRE = """
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
if redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now, ARGV[4])
  redis.call('PEXPIRE', key, math.ceil(window * 1000))
  return '0'
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return tostring(tonumber(oldest[2]) + window - now)
"""


class RedisRateLimiter:
    """Sliding window in a Redis sorted set, shared by every worker using that Redis."""

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "rlguard:alerts:rate:",
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._clock = clock
        self._sleep = sleep
        self._script = redis.register_script(_ACQUIRE)

    def acquire(self, key: str, *, limit: int, window_s: float, max_wait_s: float = 120.0) -> float:
        _check(limit, window_s)
        waited = 0.0
        while True:
            member = f"{self._clock():.6f}-{uuid.uuid4().hex[:8]}"
            try:
                answer = self._script(
                    keys=[self._prefix + key], args=[self._clock(), window_s, limit, member]
                )
            except RedisError as exc:
                raise RateLimitUnavailable(
                    f"{key}: rate limiter unreachable: {type(exc).__name__}"
                ) from exc
            pause = float(answer.decode() if isinstance(answer, bytes) else answer)
            if pause <= 0:
                return waited
            if waited + pause > max_wait_s:
                raise RateLimitWaitTooLong(
                    f"{key}: would wait {waited + pause:.1f} s > {max_wait_s} s"
                )
            self._sleep(pause)
            waited += pause
