"""Coordinator rounds and failure detection with real participant processes, and leader failover
between real coordinator processes whose lease lives in real Redis or PostgreSQL."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The coordinator's HTTP protocol on purpose: these tests speak it as a participant would.
from recovery.checkpoint import _http
from recovery.checkpoint.coordinator import Coordinator
from recovery.checkpoint.detector import HealthChange
from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.lease import RedisLease
from recovery.checkpoint.version import VersionVector
from tests.harness import free_port, wait_for
from tests.integration.checkpoint._lease import drop_redis_lease_keys

from .procs import Procs, rounds, steps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


@pytest.fixture
def health_changes() -> list[HealthChange]:
    return []


@pytest.fixture
def coord(redis_url: str, health_changes: list[HealthChange]) -> Iterator[Coordinator]:
    name = f"coord-{uuid.uuid4().hex[:8]}"
    lease = RedisLease(redis_url, name=name, ttl=2.0, timeout=0.5)
    c = Coordinator(
        coordinator_id="c1",
        lease=lease,
        round_timeout=2.0,
        request_timeout=1.0,
        checkpoint_interval_steps=None,
        suspect_after=0.8,
        confirm_after=1.5,
        on_health_change=health_changes.append,
    )
    c.start()
    yield c
    c.close()
    lease.close()
    drop_redis_lease_keys(redis_url, name)


def _registered(coord: Coordinator, n: int) -> bool:
    return coord.is_leader and len(coord.status()["participants"]) == n


def test_full_round_with_real_processes(coord: Coordinator, procs: Procs, tmp_path: Path) -> None:
    root = tmp_path / "trainer-ckpt"
    _, tlog = procs.participant("trainer", "trainer", [coord.url], (100, 20), ckpt_root=root)
    _, rlog = procs.participant("rollout", "rollout", [coord.url], (99, 20))
    _, blog = procs.participant("buffer", "buffer", [coord.url], (99, 20))
    wait_for(lambda: _registered(coord, 3), what="3 participants registered")
    outcome = coord.run_round("test")
    assert outcome.committed, outcome.reason
    assert outcome.global_version == VersionVector(100, 20)
    assert coord.lease.read_state()["global_version"] == {
        "training_step": 100,
        "inference_version": 20,
    }
    for log in (tlog, rlog, blog):
        got = wait_for(
            lambda log=log: rounds(log) and rounds(log)[-1]["event"] == "round" and rounds(log)
        )
        assert got[-1]["committed"] and got[-1]["global_version"]["training_step"] == 100
    # The trainer really saved a checkpoint at the global version.
    info = CheckpointEngine(root).latest()
    assert info is not None and info.version == VersionVector(100, 20)
    assert outcome.saved["trainer"]["path"] == str(info.path)


def test_participant_hanging_in_prepare_aborts_round(coord: Coordinator, procs: Procs) -> None:
    _, tlog = procs.participant("trainer", "trainer", [coord.url], (100, 20))
    _, rlog = procs.participant("rollout", "rollout", [coord.url], (100, 20), mode="hang")
    wait_for(lambda: _registered(coord, 2))
    started = time.monotonic()
    outcome = coord.run_round("test")
    took = time.monotonic() - started
    assert not outcome.committed
    assert "rollout" in outcome.reason and "no safe point" in outcome.reason
    assert 2.0 <= took < 6.0, took  # the round timeout, not forever
    assert coord.global_version is None and coord.lease.read_state()["global_version"] is None
    got = wait_for(lambda: [r for r in rounds(tlog) if r["event"] == "round"])
    assert got[-1]["committed"] is False
    before = steps(tlog)
    wait_for(lambda: steps(tlog) > before + 20, what="trainer resumed")
    assert rounds(rlog) == []


def test_participant_killed_mid_round(coord: Coordinator, procs: Procs) -> None:
    _, tlog = procs.participant("trainer", "trainer", [coord.url], (100, 20))
    victim, vlog = procs.participant("rollout", "rollout", [coord.url], (100, 20), mode="slow_save")
    wait_for(lambda: _registered(coord, 2))
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(coord.run_round("test")))
    runner.start()
    wait_for(lambda: any(r["event"] == "saving" for r in rounds(vlog)), what="victim saving")
    procs.kill(victim)
    runner.join(10)
    (outcome,) = results
    assert not outcome.committed and "rollout" in outcome.reason
    assert coord.global_version is None
    got = wait_for(lambda: [r for r in rounds(tlog) if r["event"] == "round"])
    assert got[-1]["committed"] is False
    before = steps(tlog)
    wait_for(lambda: steps(tlog) > before + 20, what="trainer resumed")


def test_suspected_then_cleared_and_suspected_then_confirmed(
    coord: Coordinator, procs: Procs, health_changes: list[HealthChange]
) -> None:
    slow, _ = procs.participant("slow", "rollout", [coord.url], (1, 1))
    dead, _ = procs.participant("dead", "rollout", [coord.url], (1, 1))
    wait_for(lambda: _registered(coord, 2))
    seen = lambda: {(c.name, c.old.value, c.new.value) for c in health_changes}  # noqa: E731
    procs.kill(slow, signal.SIGSTOP)
    procs.kill(dead, signal.SIGKILL)
    wait_for(lambda: {("slow", "alive", "suspected"), ("dead", "alive", "suspected")} <= seen())
    procs.kill(slow, signal.SIGCONT)
    wait_for(lambda: ("slow", "suspected", "alive") in seen(), what="slow cleared")
    wait_for(lambda: ("dead", "suspected", "failed") in seen(), what="dead confirmed")
    status = coord.status()["participants"]
    assert status["slow"]["health"] == "alive" and status["dead"]["health"] == "failed"
    assert ("slow", "suspected", "failed") not in seen()
    # A failed participant is left out of the next round, which then commits.
    outcome = coord.run_round("after failure")
    assert outcome.committed and outcome.members == ("slow",)


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_leader_killed_standby_takes_over(
    backend: str, request: pytest.FixtureRequest, procs: Procs
) -> None:
    url = request.getfixturevalue("redis_url" if backend == "redis" else "postgres_url")
    name = f"failover-{uuid.uuid4().hex[:8]}"
    if backend == "redis":
        request.addfinalizer(lambda: drop_redis_lease_keys(url, name))
    ttl = 2.0
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    leader, _ = procs.spawn(
        "tests.integration.checkpoint._coordinator_proc",
        "c1",
        backend,
        url,
        name,
        str(ttl),
        str(ports[0]),
    )
    wait_for(lambda: _http.call(urls[0], "/v1/status", None, timeout=1)["leader"], what="c1 leads")
    procs.spawn(
        "tests.integration.checkpoint._coordinator_proc",
        "c2",
        backend,
        url,
        name,
        str(ttl),
        str(ports[1]),
    )
    _, tlog = procs.participant("trainer", "trainer", urls, (40, 8))
    procs.participant("rollout", "rollout", urls, (40, 8))
    status = lambda i: _http.call(urls[i], "/v1/status", None, timeout=1)  # noqa: E731
    wait_for(lambda: len(status(0)["participants"]) == 2 and len(status(1)["participants"]) == 2)
    assert not status(1)["leader"]

    assert _http.call(urls[0], "/v1/rounds", {"reason": "before failover"}, timeout=2)
    wait_for(lambda: (status(0)["last_round"] or {}).get("committed"), what="first round")
    assert status(0)["global_version"] == {"training_step": 40, "inference_version": 8}

    procs.kill(leader)
    killed_at = time.monotonic()
    wait_for(lambda: status(1)["leader"], timeout=3 * ttl, what="standby takes over")
    took = time.monotonic() - killed_at
    # At most one TTL for the lease to expire, plus one acquire attempt (every ttl / 3), plus
    # slack for a loaded machine and the status polling.
    assert took <= ttl + ttl / 3 + 1.5, f"takeover took {took:.1f} s with a {ttl} s lease"
    after = status(1)
    assert after["global_version"] == {"training_step": 40, "inference_version": 8}
    assert after["last_round_id"] == 1
    # The new leader runs rounds; round ids continue where the old leader stopped.
    assert _http.call(urls[1], "/v1/rounds", {"reason": "after failover"}, timeout=2)
    wait_for(lambda: (status(1)["last_round"] or {}).get("committed"), what="round after failover")
    assert status(1)["last_round"]["round_id"] == 2
    got = wait_for(
        lambda: [r for r in rounds(tlog) if r["event"] == "round" and r["round_id"] == 2]
    )
    assert got[-1]["committed"]
