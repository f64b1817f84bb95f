"""The shared WeCom rate limiter on the machine's real Redis."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

from app.alerts.ratelimit import RateLimitWaitTooLong, RedisRateLimiter

pytestmark = pytest.mark.integration


@pytest.fixture
def client(redis_url: str):  # noqa: ANN201
    r = redis.Redis.from_url(redis_url)
    prefix = f"rlguard:test:{uuid.uuid4().hex[:8]}:"
    yield r, prefix
    for key in r.scan_iter(prefix + "*"):
        r.delete(key)
    r.close()


def test_window_is_shared_by_every_limiter_on_the_same_redis(client) -> None:  # noqa: ANN001
    r, prefix = client
    now = [1000.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    a = RedisRateLimiter(r, prefix=prefix, clock=lambda: now[0], sleep=sleep)
    b = RedisRateLimiter(r, prefix=prefix, clock=lambda: now[0], sleep=sleep)  # another worker
    for limiter in (a, b, a):
        assert limiter.acquire("wecom", limit=3, window_s=60) == 0.0
    assert b.acquire("wecom", limit=3, window_s=60) == pytest.approx(60.0)
    assert slept == [pytest.approx(60.0)]
    assert a.acquire("other", limit=3, window_s=60) == 0.0  # channels do not share a window
    a.acquire("wecom", limit=3, window_s=60)
    b.acquire("wecom", limit=3, window_s=60)  # the window is full again
    with pytest.raises(RateLimitWaitTooLong, match="wecom: would wait 60.0 s > 1"):
        a.acquire("wecom", limit=3, window_s=60, max_wait_s=1)
    assert r.pttl(prefix + "wecom") > 0  # the key expires on its own


def test_concurrent_workers_never_exceed_the_limit(client) -> None:  # noqa: ANN001
    r, prefix = client
    granted: list[int] = []
    refused: list[int] = []

    def worker(n: int) -> None:
        limiter = RedisRateLimiter(r, prefix=prefix)
        try:
            limiter.acquire("wecom", limit=20, window_s=60, max_wait_s=0)
            granted.append(n)
        except RateLimitWaitTooLong:
            refused.append(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(granted) == 20 and len(refused) == 10


def test_an_unreachable_redis_refuses_instead_of_crashing_the_send() -> None:
    from app.alerts.ratelimit import RateLimitUnavailable
    from tests.harness import free_port

    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    with pytest.raises(
        RateLimitUnavailable, match="wecom: rate limiter unreachable: ConnectionError"
    ):
        RedisRateLimiter(dead).acquire("wecom", limit=20, window_s=60)
