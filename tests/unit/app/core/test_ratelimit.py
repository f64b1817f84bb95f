from __future__ import annotations

import pytest

from app.core.ratelimit import (
    LoginNameThrottle,
    TokenBucketLimiter,
    bearer_token_key,
    client_address,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refusal_with_the_wait_until_the_next_token() -> None:
    clock = FakeClock()
    lim = TokenBucketLimiter(rate=2.0, burst=3, clock=clock)
    assert [lim.acquire("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert lim.acquire("a") == pytest.approx(0.5)
    assert lim.acquire("b") == 0.0  # buckets are per key
    clock.now += 0.5
    assert lim.acquire("a") == 0.0
    assert lim.acquire("a") == pytest.approx(0.5)
    clock.now += 100  # refills only up to the burst
    assert [lim.acquire("a") for _ in range(4)][-1] > 0


def test_refused_attempts_do_not_extend_the_wait() -> None:
    clock = FakeClock()
    lim = TokenBucketLimiter(rate=1.0, burst=1, clock=clock)
    assert lim.acquire("a") == 0.0
    for _ in range(50):
        assert lim.acquire("a") == pytest.approx(1.0)
    clock.now += 1.0
    assert lim.acquire("a") == 0.0


def test_memory_is_bounded_by_max_keys() -> None:
    lim = TokenBucketLimiter(rate=1.0, burst=1, max_keys=10, clock=FakeClock())
    for i in range(1000):
        lim.acquire(f"k{i}")
    assert len(lim) == 10


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"rate": 0, "burst": 1}, "rate"),
        ({"rate": 1, "burst": 0}, "burst"),
        ({"rate": 1, "burst": 1, "max_keys": 0}, "max_keys"),
    ],
)
def test_bad_parameters_are_refused_by_name(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        TokenBucketLimiter(**kwargs)


def test_keys_never_contain_the_token() -> None:
    scope = {"headers": [(b"authorization", b"Bearer rlgn_secret")], "client": ("10.0.0.1", 5)}
    key = bearer_token_key(scope)
    assert key.startswith("token:") and "secret" not in key
    assert bearer_token_key({"headers": [], "client": ("10.0.0.1", 5)}) == "addr:10.0.0.1"
    assert client_address({"client": None}) == "unknown"


def test_login_name_throttle_lets_a_clean_address_past_an_empty_budget() -> None:
    clock = FakeClock()
    throttle = LoginNameThrottle(rate=1.0, burst=2, clock=clock)  # refills in 2 s
    for address in ("a", "b"):
        assert throttle.acquire("root", address) == 0.0
        throttle.failed("root", address)
    # The budget is spent: the addresses that failed wait, a clean one may try.
    assert throttle.acquire(" root ", "a") > 0  # the name as typed, stripped
    assert throttle.acquire("root", "b") > 0
    assert throttle.acquire("root", "c") == 0.0
    throttle.failed("root", "c")
    assert throttle.acquire("root", "c") > 0  # one guess per address while the name is locked
    assert throttle.acquire("lena", "a") == 0.0  # failures count for their own name only
    clock.now += 2.0  # the bucket refilled; the failures are forgotten with it
    assert throttle.acquire("root", "a") == 0.0


def test_login_name_throttle_forgets_the_oldest_failures_beyond_max_keys() -> None:
    clock = FakeClock()
    throttle = LoginNameThrottle(rate=0.01, burst=1, max_keys=2, clock=clock)
    assert throttle.acquire("root", "a") == 0.0
    for address in ("a", "b", "c"):
        throttle.failed("root", address)
    assert throttle.acquire("root", "a") == 0.0  # forgotten: one more try, never more memory
    assert throttle.acquire("root", "c") > 0
