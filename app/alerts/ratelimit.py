"""Per-channel rate limiting: a WeCom robot accepts about 20 messages a minute."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol


class RateLimiter(Protocol):
    def acquire(self, key: str, *, limit: int, window_s: float) -> float:
        """Block until one more send under `key` stays within `limit` per `window_s`.

        Returns the seconds waited.
        """
        ...


class SlidingWindowRateLimiter:
    """In-process sliding window: the (limit+1)-th send waits until the oldest leaves the window.

    Good for one worker process; several processes sharing a robot need a shared limiter (the
    robot's own refusal, errcode 45009, is still honoured by the delivery client either way).
    """

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

    def acquire(self, key: str, *, limit: int, window_s: float) -> float:
        if limit < 1 or window_s <= 0:
            raise ValueError(f"rate limit {limit}/{window_s}s must be positive")
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
            self._sleep(pause)
            waited += pause
