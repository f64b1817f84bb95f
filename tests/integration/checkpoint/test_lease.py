from __future__ import annotations

import time

import pytest

from recovery.checkpoint.errors import CheckpointInputError, LeaseError
from recovery.checkpoint.lease import PostgresLease, RedisLease
from tests.harness import free_port
from tests.integration.checkpoint._lease import LeaseFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_one_holder_at_a_time_and_fenced_state(lease_factory: LeaseFactory) -> None:
    a, b = lease_factory(), lease_factory()
    grant = a.try_acquire("coord-a")
    assert grant is not None and grant.holder == "coord-a"
    assert b.try_acquire("coord-b") is None
    assert a.renew("coord-a") and not b.renew("coord-b")
    assert b.current_holder() == "coord-a"
    assert a.publish("coord-a", {"global_version": [3, 1]})
    assert not b.publish("coord-b", {"global_version": [9, 9]})
    assert b.read_state() == {"global_version": [3, 1]}
    again = a.try_acquire("coord-a")  # re-acquiring what we hold keeps the epoch
    assert again is not None and again.epoch == grant.epoch


def test_expired_lease_goes_to_the_standby_and_fences_the_old_leader(
    lease_factory: LeaseFactory,
) -> None:
    a, b = lease_factory(ttl=0.5, timeout=0.5), lease_factory(ttl=0.5, timeout=0.5)
    first = a.try_acquire("coord-a")
    assert first is not None
    time.sleep(0.8)  # the leader "hangs" past its TTL
    assert a.current_holder() is None
    second = b.try_acquire("coord-b")
    assert second is not None and second.epoch > first.epoch
    assert not a.renew("coord-a")
    assert not a.publish("coord-a", {"stale": True})
    assert b.publish("coord-b", {"fresh": True})
    assert a.read_state() == {"fresh": True}


def test_release_hands_over_at_once(lease_factory: LeaseFactory) -> None:
    a, b = lease_factory(ttl=30), lease_factory(ttl=30)
    assert a.try_acquire("coord-a") is not None
    b.release("coord-b")  # not ours: no effect
    assert b.try_acquire("coord-b") is None
    a.release("coord-a")
    assert b.try_acquire("coord-b") is not None
    assert a.current_holder() == "coord-b"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name!"}, "lease name"),
        ({"name": "ok", "ttl": 0}, "ttl"),
        ({"name": "ok", "ttl": 1, "timeout": 5}, "timeout"),
    ],
)
def test_bad_lease_arguments(redis_url: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(CheckpointInputError, match=message):
        RedisLease(redis_url, **kwargs)  # type: ignore[arg-type]


def test_bad_holder(lease_factory: LeaseFactory) -> None:
    with pytest.raises(CheckpointInputError, match="holder"):
        lease_factory().try_acquire("")


def test_unreachable_backends_raise_lease_error() -> None:
    port = free_port()
    lease = RedisLease(f"redis://127.0.0.1:{port}/0", name="x", ttl=2, timeout=0.5)
    with pytest.raises(LeaseError, match="redis lease 'x'"):
        lease.try_acquire("coord-a")
    with pytest.raises(LeaseError, match="postgres lease 'x'"):
        PostgresLease(f"postgresql://postgres@127.0.0.1:{port}/test", name="x", ttl=2, timeout=0.5)
