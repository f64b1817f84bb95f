"""Rate limits on the endpoints an attacker or a runaway agent would hammer.

A token bucket per key (client address for login attempts, the bearer token's hash for ingest)
refills at ``rate`` per second up to ``burst``. A refused request gets ``429 Too Many Requests``
with ``Retry-After`` (whole seconds until one token is back) and never reaches the route, so it
changes nothing.

The buckets live in this process. Behind several replicas each replica limits on its own, which
multiplies the allowance by the replica count; that bound is still what matters here (stopping
password guessing and a flood from one token), and it needs no round trip on the hot path.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send


class TokenBucketLimiter:
    """Token buckets per key; at most ``max_keys`` are tracked (least recently used go first)."""

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, got {burst!r}")
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys!r}")
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()

    def acquire(self, key: str) -> float:
        """Take one token for ``key``: 0.0 when allowed, else seconds until one is available."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                tokens -= 1.0
                wait = 0.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            # Forgetting a key only ever gives it a fresh (full) bucket: memory stays bounded
            # whatever number of addresses or tokens an attacker cycles through.
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
            return wait

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


class LoginNameThrottle:
    """Login attempts per user name, which strangers cannot use up for the user.

    Each attempt takes a token from the name's bucket (from any address: a guesser spreading
    over many addresses still meets it). A bucket alone would let 30 wrong guesses from
    anywhere lock the real user out, so while a name's bucket is empty an address that has no
    failed attempt for that name is still let through: the user, from their own machine, signs
    in. Every failed attempt marks its (name, address) pair for as long as the bucket takes to
    refill, so each address gets at most one guess at a locked name; the per-address limit
    (``RateLimitMiddleware``) and the password hash's cost bound what many addresses can do.
    """

    def __init__(
        self,
        *,
        rate: float,
        burst: int,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.names = TokenBucketLimiter(rate=rate, burst=burst, max_keys=max_keys, clock=clock)
        self.max_keys = max_keys
        self._clock = clock
        self._remember_s = burst / rate  # an empty bucket is full again after this
        self._failed: OrderedDict[tuple[str, str], float] = OrderedDict()  # -> when, last
        self._lock = threading.Lock()

    def acquire(self, name: str, address: str) -> float:
        """Take one attempt for ``name`` from ``address``: 0.0 when allowed, else seconds until
        the name's bucket has a token again."""
        key = _login_name_key(name)
        wait = self.names.acquire(key)
        if wait == 0.0 or not self._has_failed(key, address):
            return 0.0
        return wait

    def failed(self, name: str, address: str) -> None:
        """Note a wrong password (or unknown name) tried from ``address``."""
        pair = (_login_name_key(name), address)
        with self._lock:
            self._failed.pop(pair, None)
            self._failed[pair] = self._clock()
            while len(self._failed) > self.max_keys:  # forgetting only ever lets one more try
                self._failed.popitem(last=False)

    def _has_failed(self, key: str, address: str) -> bool:
        with self._lock:
            at = self._failed.get((key, address))
            return at is not None and self._clock() - at < self._remember_s


def _login_name_key(name: str) -> str:
    """A hash of the name as typed (stripped): unknown names cost an attacker the same, and a
    password typed into the name field is not kept in memory either."""
    return "name:" + hashlib.sha256(name.strip().encode()).hexdigest()[:32]


KeyFunc = Callable[[Scope], str]


@dataclass(frozen=True, slots=True)
class RateLimitRule:
    """Requests ``method path`` are limited by ``limiter``, one bucket per ``key(scope)``."""

    method: str
    path: str
    limiter: TokenBucketLimiter
    key: KeyFunc
    what: str  # for the 429 message: "login attempts", "ingest requests"


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def bearer_token_key(scope: Scope) -> str:
    """The bearer token's hash (never the token itself); the client address without one."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return "token:" + hashlib.sha256(token.strip()).hexdigest()[:32]
    return "addr:" + client_address(scope)


class RateLimitMiddleware:
    """Plain ASGI middleware: refuses over-limit requests with 429 before any route runs."""

    def __init__(self, app: ASGIApp, rules: list[RateLimitRule]) -> None:
        self.app = app
        self.rules = {(r.method, r.path): r for r in rules}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            rule = self.rules.get((scope["method"], scope["path"]))
            if rule is not None:
                wait = rule.limiter.acquire(rule.key(scope))
                if wait > 0:
                    await _too_many(send, rule.what, wait)
                    return
        await self.app(scope, receive, send)


async def _too_many(send: Send, what: str, wait: float) -> None:
    retry_after = max(1, math.ceil(wait))
    body = orjson.dumps({"detail": f"too many {what}; retry in {retry_after} s"})
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(retry_after).encode()),
                # Answered before the body was read: closing spares the loop parsing it
                # (app.core.errors.ServiceError.closes_connection).
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
