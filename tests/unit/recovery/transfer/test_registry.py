from __future__ import annotations

import threading

import pytest

from recovery.transfer.errors import (
    NoSourceError,
    TransferConfigError,
    UnknownVersionError,
    VersionDiscardedError,
)
from recovery.transfer.registry import ABORTED, COMMITTED, PUBLISHING, InMemoryRegistry
from recovery.transfer.registry_net import RegistryClient, RegistryServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def opened(clock: Clock | None = None) -> InMemoryRegistry:
    registry = InMemoryRegistry(clock=clock or Clock())
    registry.begin(name="p", version=1, manifest_digest="d1", publisher="T", lease_s=5)
    return registry


def test_receivers_starting_together_form_a_chain_not_a_star() -> None:
    registry = opened()
    for r in ("R1", "R2", "R3"):
        registry.announce(name="p", version=1, address=r, complete=False)
    picks = {r: registry.assign_source(name="p", version=1, receiver=r) for r in ("R1", "R2", "R3")}
    assert picks == {"R1": "T", "R2": "R1", "R3": "R2"}


def test_complete_relays_are_preferred_to_the_publisher_and_load_spreads() -> None:
    registry = opened()
    registry.announce(name="p", version=1, address="A", complete=True)
    registry.announce(name="p", version=1, address="B", complete=True)
    assert registry.assign_source(name="p", version=1, receiver="X") == "A"
    assert registry.assign_source(name="p", version=1, receiver="Y") == "B"
    assert registry.assign_source(name="p", version=1, receiver="Z") == "T"
    registry.release_source(name="p", version=1, receiver="X")
    assert registry.assign_source(name="p", version=1, receiver="W") == "A"


def test_never_assigns_a_source_downstream_of_the_receiver() -> None:
    registry = opened()
    for r in ("R1", "R2"):
        registry.announce(name="p", version=1, address=r, complete=False)
    assert registry.assign_source(name="p", version=1, receiver="R1") == "T"
    assert registry.assign_source(name="p", version=1, receiver="R2") == "R1"
    # R1 lost T: R2 pulls from R1, so R2 must not be handed to R1 (they would wait on each other).
    registry.report_dead(name="p", version=1, address="T")
    with pytest.raises(NoSourceError):
        registry.assign_source(name="p", version=1, receiver="R1")


def test_dead_and_excluded_sources_are_skipped_and_relays_false_means_publisher_only() -> None:
    registry = opened()
    registry.announce(name="p", version=1, address="A", complete=True)
    registry.report_dead(name="p", version=1, address="A")
    assert registry.assign_source(name="p", version=1, receiver="X") == "T"
    registry.announce(name="p", version=1, address="B", complete=True)
    assert registry.assign_source(name="p", version=1, receiver="Y", exclude=["B"]) == "T"
    assert registry.assign_source(name="p", version=1, receiver="Z", relays=False) == "T"
    with pytest.raises(NoSourceError):
        registry.assign_source(name="p", version=1, receiver="Q", exclude=["T", "B"])


def test_a_publisher_reported_dead_is_listed_again_once_it_renews() -> None:
    registry = opened()
    registry.report_dead(name="p", version=1, address="T")
    with pytest.raises(NoSourceError):
        registry.assign_source(name="p", version=1, receiver="X")
    registry.renew(name="p", version=1, lease_s=5)
    assert registry.assign_source(name="p", version=1, receiver="X") == "T"


def test_lapsed_lease_aborts_and_commit_is_then_refused() -> None:
    clock = Clock()
    registry = opened(clock)
    clock.now += 4
    assert registry.renew(name="p", version=1, lease_s=5).state == PUBLISHING
    clock.now += 5.1
    info = registry.info(name="p", version=1)
    assert info.state == ABORTED and "lease expired" in info.reason
    with pytest.raises(VersionDiscardedError):
        registry.commit(name="p", version=1)
    with pytest.raises(VersionDiscardedError):
        registry.assign_source(name="p", version=1, receiver="X")
    with pytest.raises(VersionDiscardedError):
        registry.announce(name="p", version=1, address="X", complete=True)
    assert registry.latest_committed(name="p") is None


def test_commit_counts_complete_sources_and_survives_lease_end() -> None:
    clock = Clock()
    registry = opened(clock)
    registry.announce(name="p", version=1, address="A", complete=False)
    assert registry.info(name="p", version=1).complete_sources == 1  # the publisher only
    registry.announce(name="p", version=1, address="A", complete=True)
    assert registry.info(name="p", version=1).complete_sources == 2
    registry.commit(name="p", version=1)
    clock.now += 60
    assert registry.info(name="p", version=1).state == COMMITTED
    registry.abort(name="p", version=1, reason="too late")  # committed versions stay committed
    assert registry.latest_committed(name="p") == 1


def test_versions_must_grow_and_old_ones_are_forgotten() -> None:
    registry = InMemoryRegistry(keep_versions=2)
    for v in (1, 2, 3):
        registry.begin(name="p", version=v, manifest_digest=f"d{v}", publisher="T", lease_s=5)
    with pytest.raises(TransferConfigError, match="v2 is not newer than v3"):
        registry.begin(name="p", version=2, manifest_digest="x", publisher="T", lease_s=5)
    with pytest.raises(UnknownVersionError, match="'p' v1"):
        registry.info(name="p", version=1)
    assert registry.info(name="p", version=2).manifest_digest == "d2"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"lease_s": 0}, "lease_s"), ({"version": -3}, "version")],
)
def test_begin_rejects_bad_values(kwargs: dict[str, object], match: str) -> None:
    registry = InMemoryRegistry()
    args: dict[str, object] = {
        "name": "p",
        "version": 1,
        "manifest_digest": "d",
        "publisher": "T",
        "lease_s": 5,
    }
    with pytest.raises(TransferConfigError, match=match):
        registry.begin(**{**args, **kwargs})  # type: ignore[arg-type]
    with pytest.raises(UnknownVersionError):
        registry.info(name="p", version=1)


def test_keep_versions_must_leave_room_for_the_previous_version() -> None:
    with pytest.raises(TransferConfigError, match="keep_versions"):
        InMemoryRegistry(keep_versions=1)


def _wait_in_thread(registry: object, **kwargs: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(registry.wait(**kwargs)))  # type: ignore[attr-defined]
    thread.start()
    return thread, out


@pytest.mark.parametrize("over_tcp", [False, True])
def test_wait_wakes_on_the_change_it_waits_for_not_on_a_poll(over_tcp: bool) -> None:
    registry = opened(Clock())
    server = RegistryServer(registry) if over_tcp else None
    client = RegistryClient(server.address, timeout=5.0) if server else registry
    try:
        # A publisher waiting for its first replica: an unrelated change does not end the wait.
        waiter, out = _wait_in_thread(client, name="p", version=1, min_complete=2, timeout=30.0)
        registry.announce(name="p", version=1, address="A", complete=False)
        waiter.join(0.2)
        assert waiter.is_alive() and not out
        registry.announce(name="p", version=1, address="A", complete=True)
        waiter.join(5.0)
        assert not waiter.is_alive() and out[0].complete_sources == 2  # type: ignore[attr-defined]
        # A receiver waiting for the commit; calls on the same client are not held up meanwhile.
        waiter, out = _wait_in_thread(client, name="p", version=1, min_complete=None, timeout=30.0)
        assert client.info(name="p", version=1).state == PUBLISHING
        registry.commit(name="p", version=1)
        waiter.join(5.0)
        assert not waiter.is_alive() and out[0].state == COMMITTED  # type: ignore[attr-defined]
    finally:
        if server is not None:
            client.close()  # type: ignore[union-attr]
            server.close()


def test_wait_returns_the_current_state_at_its_timeout_and_an_abort_at_once() -> None:
    registry = opened()
    info = registry.wait(name="p", version=1, min_complete=2, timeout=0.0)
    assert info.state == PUBLISHING and info.complete_sources == 1
    registry.abort(name="p", version=1, reason="trainer died")
    info = registry.wait(name="p", version=1, min_complete=None, timeout=30.0)
    assert info.state == ABORTED and info.reason == "trainer died"
    with pytest.raises(UnknownVersionError):
        registry.wait(name="p", version=9, min_complete=None, timeout=0.0)
    with pytest.raises(TransferConfigError, match="timeout"):
        registry.wait(name="p", version=1, min_complete=None, timeout=-1.0)
