"""Coordinator and participants in one process over real localhost HTTP; the lease is in memory.
Real participant processes and real Redis/PostgreSQL leases: tests/integration/checkpoint."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

# The coordinator's HTTP protocol on purpose: these tests speak it as a participant would.
from recovery.checkpoint import _http
from recovery.checkpoint.coordinator import Coordinator, Participant, RoundOutcome
from recovery.checkpoint.errors import CheckpointInputError, CoordinatorError
from recovery.checkpoint.participant import RoundResult
from recovery.checkpoint.version import VersionVector
from recovery.errors import RecoveryTimeout
from tests.harness import wait_for

from .memory_lease import MemoryLease

pytestmark = pytest.mark.timeout(60)
V = VersionVector


class Loop:
    """A participant's training loop in a thread: steps, and calls safe_point between steps."""

    def __init__(self, p: Participant, *, step_seconds: float = 0.01, hang: bool = False) -> None:
        self.p = p
        self.hang = hang
        self.step_seconds = step_seconds
        self.results: list[RoundResult] = []
        self.steps = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            time.sleep(self.step_seconds)
            if self.hang:
                continue  # stuck inside a step: never reaches a safe point
            self.steps += 1
            result = self.p.safe_point(timeout=10)
            if result is not None:
                self.results.append(result)


@pytest.fixture
def cluster() -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make_coordinator(**kw: Any) -> Coordinator:
        opts: dict[str, Any] = {
            "coordinator_id": "c1",
            "lease": MemoryLease(),
            "round_timeout": 1.0,
            "checkpoint_interval_steps": None,
            "suspect_after": 0.5,
            "confirm_after": 1.0,
        }
        opts.update(kw)
        c = Coordinator(**opts)
        c.start()
        made.append(c)
        return c

    def make_participant(
        coord: Coordinator, name: str, role: str, version: VersionVector, **kw: Any
    ) -> Loop:
        on_commit = kw.pop("on_commit", lambda rid, target: {"round": rid, "by": name})
        hang = kw.pop("hang", False)
        p = Participant(
            name, role, [coord.url], version=version, on_commit=on_commit,
            heartbeat_interval=0.1, request_timeout=1.0, **kw,
        )  # fmt: skip
        p.start()
        loop = Loop(p, hang=hang)
        loop.thread.start()
        made.append(loop)
        return loop

    make_coordinator.participant = make_participant  # type: ignore[attr-defined]
    yield make_coordinator
    for item in reversed(made):
        if isinstance(item, Loop):
            item.stop.set()
            item.thread.join(5)
            item.p.close()
        else:
            item.close()


def test_full_round_bumps_global_version_and_everyone_resumes(cluster: Any) -> None:
    coord = cluster(expected=("trainer", "rollout", "buffer"))
    trainer = cluster.participant(coord, "trainer", "trainer", V(50, 10))
    rollout = cluster.participant(coord, "rollout", "rollout", V(48, 10))
    buffer = cluster.participant(coord, "buffer", "buffer", V(48, 10))
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 3)
    outcome = coord.run_round("test")
    assert outcome.committed, outcome.reason
    assert outcome.global_version == V(50, 10)
    assert outcome.saved["trainer"] == {"round": 1, "by": "trainer"}
    assert coord.lease.read_state()["global_version"] == {
        "training_step": 50,
        "inference_version": 10,
    }
    for loop in (trainer, rollout, buffer):
        wait_for(lambda loop=loop: loop.results)
        assert loop.results[0].committed and loop.results[0].global_version == V(50, 10)
        before = loop.steps
        wait_for(lambda loop=loop, before=before: loop.steps > before + 3)  # resumed
        assert loop.p.global_version == V(50, 10)


def test_hung_participant_aborts_round_and_version_stays(cluster: Any) -> None:
    coord = cluster()
    trainer = cluster.participant(coord, "trainer", "trainer", V(50, 10))
    cluster.participant(coord, "rollout", "rollout", V(50, 10), hang=True)
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    started = time.monotonic()
    outcome = coord.run_round("test")
    assert not outcome.committed and "rollout" in outcome.reason
    assert 1.0 <= time.monotonic() - started < 5
    assert coord.global_version is None and coord.status()["global_version"] is None
    wait_for(lambda: trainer.results)
    assert not trainer.results[0].committed
    before = trainer.steps
    wait_for(lambda: trainer.steps > before + 3)


def test_round_waits_for_a_lagging_rollout_to_serve_the_trainers_weights(cluster: Any) -> None:
    coord = cluster(round_timeout=3.0)
    trainer = cluster.participant(coord, "trainer", "trainer", V(50, 11))
    rollout = cluster.participant(coord, "rollout", "rollout", V(48, 10))
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    # The rollout finishes pulling weight version 11 while the trainer is already frozen.
    threading.Timer(0.5, lambda: rollout.p.set_version(V(50, 11))).start()
    outcome = coord.run_round("test")
    assert outcome.committed, outcome.reason
    assert outcome.global_version == V(50, 11)
    wait_for(lambda: trainer.results and rollout.results)


def test_round_aborts_when_the_rollout_never_catches_up(cluster: Any) -> None:
    coord = cluster()
    cluster.participant(coord, "trainer", "trainer", V(50, 11))
    cluster.participant(coord, "rollout", "rollout", V(48, 10))
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    outcome = coord.run_round("test")
    assert not outcome.committed
    assert "while serving weight version >= 11" in outcome.reason
    assert coord.global_version is None


def test_round_refused_off_sync_boundary(cluster: Any) -> None:
    coord = cluster()
    cluster.participant(coord, "trainer", "trainer", V(50, 11))
    cluster.participant(coord, "rollout", "rollout", V(60, 12))  # weights from a rolled-back future
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    outcome = coord.run_round("test")
    assert not outcome.committed and "not at a sync boundary" in outcome.reason


def test_failing_save_aborts(cluster: Any) -> None:
    def broken(rid: int, target: VersionVector) -> None:
        raise OSError("disk full")

    coord = cluster()
    cluster.participant(coord, "trainer", "trainer", V(5, 1), on_commit=broken)
    wait_for(lambda: coord.is_leader and coord.status()["participants"])
    outcome = coord.run_round("test")
    assert not outcome.committed and "disk full" in outcome.reason


def test_step_interval_triggers_rounds(cluster: Any) -> None:
    outcomes: list[RoundOutcome] = []
    coord = cluster(checkpoint_interval_steps=50, on_round=outcomes.append)
    trainer = cluster.participant(coord, "trainer", "trainer", V(10, 1))
    wait_for(lambda: coord.is_leader and coord.status()["participants"])
    time.sleep(0.5)
    assert outcomes == []
    trainer.p.set_version(V(50, 1))
    wait_for(lambda: outcomes)
    assert outcomes[0].committed and outcomes[0].global_version == V(50, 1)
    time.sleep(0.5)
    assert len(outcomes) == 1  # not again until step 100


def test_time_interval_and_http_request_trigger_rounds(cluster: Any) -> None:
    outcomes: list[RoundOutcome] = []
    coord = cluster(checkpoint_interval_seconds=0.5, on_round=outcomes.append)
    cluster.participant(coord, "trainer", "trainer", V(1, 1))
    wait_for(lambda: len(outcomes) >= 2)
    assert all(o.reason.startswith("time interval") for o in outcomes)
    other = cluster(coordinator_id="c2", lease=MemoryLease(), checkpoint_interval_seconds=None)
    cluster.participant(other, "t2", "trainer", V(1, 1))
    wait_for(lambda: other.is_leader and other.status()["participants"])
    assert _http.call(other.url, "/v1/rounds", {"reason": "operator"}, timeout=2) == {
        "requested": True
    }
    wait_for(lambda: other.last_outcome is not None)
    assert other.last_outcome.reason == "operator" and other.last_outcome.committed


def test_staleness_bound_makes_trainer_wait(cluster: Any) -> None:
    coord = cluster(max_staleness=5)
    trainer = cluster.participant(coord, "trainer", "trainer", V(15, 3))
    rollout = cluster.participant(coord, "rollout", "rollout", V(9, 2))
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    trainer.p.heartbeat_now()
    assert trainer.p.must_wait
    threading.Timer(0.3, lambda: rollout.p.set_version(V(12, 3))).start()
    trainer.p.wait_until_allowed(timeout=5)
    assert not trainer.p.must_wait


def test_suspected_cleared_and_confirmed(cluster: Any) -> None:
    changes: list[tuple[str, str, str]] = []
    coord = cluster(on_health_change=lambda c: changes.append((c.name, c.old.value, c.new.value)))
    a = cluster.participant(coord, "a", "rollout", V(1, 1))
    b = cluster.participant(coord, "b", "rollout", V(1, 1))
    wait_for(lambda: len(coord.status()["participants"]) == 2)
    a.p._stop.set()  # a goes quiet for a while, then comes back
    b.p._stop.set()  # b goes quiet for good
    wait_for(lambda: ("a", "alive", "suspected") in changes)
    a.p._stop.clear()
    threading.Thread(target=a.p._heartbeat_loop, daemon=True).start()
    wait_for(lambda: ("a", "suspected", "alive") in changes)
    wait_for(lambda: ("b", "suspected", "failed") in changes, timeout=5)
    status = coord.status()["participants"]
    assert status["a"]["health"] == "alive" and status["b"]["health"] == "failed"
    assert ("a", "suspected", "failed") not in changes


def test_standby_does_not_run_rounds_and_takes_over(cluster: Any) -> None:
    lease = MemoryLease(ttl=1.5)  # renewed every 0.5 s: slack for a loaded machine
    leader = cluster(coordinator_id="c1", lease=lease)
    wait_for(lambda: leader.is_leader)
    standby = cluster(coordinator_id="c2", lease=lease)
    t = cluster.participant(leader, "trainer", "trainer", V(7, 1))
    t.p.coordinator_urls.append(standby.url)
    wait_for(lambda: standby.status()["participants"])
    assert not standby.is_leader
    with pytest.raises(CoordinatorError, match="not the leader"):
        standby.run_round()
    assert leader.run_round().committed
    leader.close(release=False)  # dies without handing over: the lease must expire
    wait_for(lambda: standby.is_leader, timeout=6)
    assert standby.global_version == V(7, 1)
    outcome = standby.run_round()
    assert outcome.committed and outcome.round_id == 2


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"role": "trainer"}, "missing field 'name'"),
        ({"name": "x", "role": "chef", "state": "idle", "callback_url": "http://a:1", "version": {}}, "'role' must be one of"),
        ({"name": "x", "role": "trainer", "state": "napping", "callback_url": "http://a:1", "version": {}}, "'state' must be one of"),
        ({"name": "x", "role": "trainer", "state": "idle", "callback_url": "http://a:1", "version": {"training_step": -1, "inference_version": 0}}, "non-negative"),
        ({"name": "x", "role": "trainer", "state": "idle", "callback_url": "ftp://a", "version": {}}, "callback_url"),
    ],
)  # fmt: skip
def test_bad_heartbeat_is_400_and_changes_nothing(
    cluster: Any, body: dict[str, Any], message: str
) -> None:
    coord = cluster()
    with pytest.raises(CoordinatorError, match="400") as exc:
        _http.call(coord.url, "/v1/heartbeat", body, timeout=2)
    assert message in str(exc.value)
    assert coord.status()["participants"] == {}


def test_bad_arguments() -> None:
    with pytest.raises(CheckpointInputError, match="role must be"):
        Participant("x", "chef", ["http://127.0.0.1:1"], version=V(0, 0))
    with pytest.raises(CheckpointInputError, match="coordinator URL"):
        Participant("x", "trainer", [], version=V(0, 0))
    with pytest.raises(CheckpointInputError, match="checkpoint_interval_steps"):
        Coordinator(coordinator_id="c", lease=MemoryLease(), checkpoint_interval_steps=0)
    with pytest.raises(CheckpointInputError, match="round_timeout"):
        Coordinator(coordinator_id="c", lease=MemoryLease(), round_timeout=0)


def test_commands_from_an_older_epoch_are_refused(cluster: Any) -> None:
    coord = cluster()
    loop = cluster.participant(coord, "t", "trainer", V(1, 1))
    wait_for(lambda: coord.is_leader and loop.p.leader_url)
    loop.p.heartbeat_now()
    epoch = coord.status()["epoch"]
    with pytest.raises(CoordinatorError, match="409"):
        _http.call(
            loop.p.url, "/v1/prepare", {"round_id": 9, "epoch": epoch - 1, "wait": 0.1}, timeout=2
        )
    assert not loop.p.prepare_pending


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/prepare", {"epoch": 1, "wait": 0.1}, "missing field 'round_id'"),
        ("/v1/prepare", {"round_id": "7", "epoch": 1, "wait": 0.1}, "'round_id' must be"),
        ("/v1/prepare", {"round_id": 7, "epoch": 1, "wait": 0.1, "min_inference_version": "3"}, "'min_inference_version' must be"),
        ("/v1/commit", {"round_id": 1, "epoch": 1, "wait": 0.1, "target_version": {"x": 1}}, "not a version vector"),
        ("/v1/finish", {"round_id": 1, "epoch": 1, "committed": True}, "needs 'global_version'"),
        ("/v1/finish", {"round_id": True, "epoch": 1, "committed": False}, "'round_id' must be an int or null"),
        ("/v1/nothing", {}, "404"),
    ],
)  # fmt: skip
def test_bad_commands_to_a_participant_are_refused(
    cluster: Any, path: str, body: dict[str, Any], message: str
) -> None:
    coord = cluster()
    loop = cluster.participant(coord, "t", "trainer", V(1, 1))
    with pytest.raises(CoordinatorError) as exc:
        _http.call(loop.p.url, path, body, timeout=2)
    assert message in str(exc.value)
    assert not loop.p.prepare_pending and loop.results == []


def test_round_requests_need_the_leader_and_a_string_reason(cluster: Any) -> None:
    lease = MemoryLease(ttl=5)
    leader = cluster(coordinator_id="c1", lease=lease)
    wait_for(lambda: leader.is_leader)
    standby = cluster(coordinator_id="c2", lease=lease)
    with pytest.raises(CoordinatorError, match="409.*not the leader"):
        _http.call(standby.url, "/v1/rounds", {"reason": "x"}, timeout=2)
    with pytest.raises(CoordinatorError, match="400.*'reason' must be a string"):
        _http.call(leader.url, "/v1/rounds", {"reason": 5}, timeout=2)
    status, body = _post_raw(leader.url, b"{not json")
    assert status == 400 and "not JSON" in body
    assert leader.last_outcome is None


def _post_raw(url: str, payload: bytes) -> tuple[int, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=2)
    try:
        conn.request("POST", "/v1/rounds", payload, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_adopting_a_restored_version_is_published_by_the_leader_only(cluster: Any) -> None:
    lease = MemoryLease(ttl=5)
    leader = cluster(coordinator_id="c1", lease=lease)
    wait_for(lambda: leader.is_leader)
    standby = cluster(coordinator_id="c2", lease=lease)
    leader.adopt_global_version(V(50, 10))
    assert leader.global_version == V(50, 10)
    assert lease.read_state()["global_version"] == {"training_step": 50, "inference_version": 10}
    with pytest.raises(CoordinatorError, match="not the leader"):
        standby.adopt_global_version(V(1, 1))
    assert lease.read_state()["global_version"] == {"training_step": 50, "inference_version": 10}


@pytest.mark.parametrize(
    "answer",
    [
        {"leader": True, "epoch": "7"},
        {"leader": True, "epoch": 1, "global_version": {"training_step": -1}},
    ],
)
def test_malformed_leader_answer_is_ignored_and_heartbeats_go_on(
    answer: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    beats: list[dict[str, Any]] = []

    def route(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        beats.append(body)
        return 200, answer

    server = _http.JsonServer("127.0.0.1", 0, {"POST /v1/heartbeat": route}, name="junk")
    server.start()
    p = Participant("t", "trainer", [server.url], version=V(1, 1), heartbeat_interval=0.05)
    try:
        p.start()
        wait_for(lambda: len(beats) >= 3)  # the thread survived the bad answers
        assert p.leader_url is None and p.global_version is None
        assert "bad heartbeat answer" in caplog.text
    finally:
        p.close()
        server.close()


def test_unreadable_published_state_does_not_stop_a_takeover(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    lease = MemoryLease(ttl=5)
    lease._state = {"global_version": {"training_step": "ten"}, "last_round_id": 4}
    coord = cluster(lease=lease)
    wait_for(lambda: coord.is_leader)
    assert coord.global_version is None
    assert "published state unreadable" in caplog.text


def test_trainer_ranks_that_disagree_abort_the_round(cluster: Any) -> None:
    coord = cluster()
    cluster.participant(coord, "trainer-0", "trainer", V(50, 10))
    cluster.participant(coord, "trainer-1", "trainer", V(49, 10))
    wait_for(lambda: coord.is_leader and len(coord.status()["participants"]) == 2)
    outcome = coord.run_round("test")
    assert not outcome.committed and "trainer ranks disagree" in outcome.reason
    assert coord.global_version is None


def test_trainer_waits_until_rollouts_serve_the_restored_weights(cluster: Any) -> None:
    from recovery.checkpoint.restore import rollout_versions, wait_until_weights_live

    coord = cluster()
    trainer = cluster.participant(coord, "trainer", "trainer", V(50, 10))
    r0 = cluster.participant(coord, "r0", "rollout", V(60, 12))  # still on rolled-back weights
    r1 = cluster.participant(coord, "r1", "rollout", V(40, 8))  # behind
    wait_for(lambda: trainer.p.leader_url and len(coord.status()["participants"]) == 3)
    with pytest.raises(RecoveryTimeout, match="'r0': 12"):
        wait_until_weights_live(
            lambda: rollout_versions(trainer.p.leader_status()),
            10,
            expected=["r0", "r1"],
            timeout=0.3,
        )
    threading.Timer(0.3, lambda: (r0.p.set_version(V(50, 10)), r1.p.set_version(V(50, 10)))).start()
    live = wait_until_weights_live(
        lambda: rollout_versions(trainer.p.leader_status()), 10, expected=["r0", "r1"], timeout=10
    )
    assert live == {"r0": V(50, 10), "r1": V(50, 10)}
    with pytest.raises(CheckpointInputError, match="not a coordinator status"):
        rollout_versions({"leader": True})
