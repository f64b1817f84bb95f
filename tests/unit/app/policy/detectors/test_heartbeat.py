"""Heartbeats and nodes: suspected, then confirmed; exited at once; several nodes heavy."""

from __future__ import annotations

import pytest

from app.policy.detectors import (
    HeartbeatDetector,
    NodeSilenceDetector,
)
from app.policy.engine import DecisionType, PolicyEngine
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)


# -- heartbeats and nodes ---------------------------------------------------------------------


def test_heartbeat_two_levels_suspected_then_confirmed() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0")
    silent_since = c.now

    def node_alive(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.8, gpu="0")
        c.participant("trainer", 1, "n0", heartbeat=silent_since)

    res = c.run(14, node_alive, detector=det)
    assert first_firing(res) is None and det.suspected == []
    res = c.run(2, node_alive, detector=det)
    assert [p.rank for p in det.suspected] == [1] and first_firing(res) is None
    res = c.run(59, node_alive, detector=det)
    fired = first_firing(res)
    assert fired is not None and c.now - 59 + fired - silent_since == pytest.approx(75, abs=1)
    assert res[fired - 1][0].kind is FaultKind.HEARTBEAT_LOST


def test_heartbeat_missing_20s_then_back_is_cleared() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0")
    stuck = c.now
    res = c.run(
        20,
        lambda c: (c.put("n0", "x", 1), c.participant("trainer", 1, "n0", heartbeat=stuck)),
        detector=det,
    )
    assert det.suspected
    res += c.run(
        100, lambda c: (c.put("n0", "x", 1), c.participant("trainer", 1, "n0")), detector=det
    )
    assert first_firing(res) is None and det.suspected == []


def test_finished_participant_is_not_lost() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("trainer", 1, "n0", phase="DONE")
    stuck = c.now
    res = c.run(
        100,
        lambda c: (
            c.put("n0", "x", 1),
            c.participant("trainer", 1, "n0", phase="DONE", heartbeat=stuck),
        ),
        detector=det,
    )
    assert first_firing(res) is None


def test_exited_participant_is_lost_at_once_and_clears_when_restarted() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("rollout", 1, "n0", phase="ROLLOUT", step=7)
    exited_at = c.now + 1

    def exited(c: Cluster) -> None:
        c.put("n0", "x", 1)
        c.participant("rollout", 1, "n0", phase="EXITED", step=7, heartbeat=exited_at)

    res = c.run(1, exited, detector=det)
    assert first_firing(res) == 1  # the first tick, not after suspect + confirm
    sig = res[0][0]
    assert sig.kind is FaultKind.HEARTBEAT_LOST and sig.extra == {"exited": True}
    assert sig.since == exited_at and sig.step == 7
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "rollout", "rank": 1}
    assert "exited" in sig.evidence.detail
    # Still the same occurrence on later ticks (same since), so one incident.
    assert [s[0].since for s in c.run(3, exited, detector=det)] == [exited_at] * 3
    res = c.run(
        30,
        lambda c: (c.put("n0", "x", 1), c.participant("rollout", 1, "n0", phase="STARTING")),
        detector=det,
    )
    assert first_firing(res) is None


@pytest.mark.parametrize("phase", ["RAY_DEAD", "RAY_RESTARTING"])
def test_ray_dead_or_restarting_actor_is_lost_at_once_with_rays_death_cause(phase: str) -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)

    def dead(c: Cluster) -> None:
        c.put("n0", m.RAY_ACTOR_DEAD, 4242, job=JOB, role="rollout", rank="3", reason="WORKER_DIED")
        c.put("n0", m.RAY_ACTOR_DEAD, 77, job=JOB, role="rollout", rank="2", reason="NODE_DIED")
        c.participant("rollout", 3, "n0", phase=phase, step=0)

    res = c.run(1, dead, detector=det)
    assert first_firing(res) == 1
    sig = res[0][0]
    assert sig.kind is FaultKind.HEARTBEAT_LOST and sig.extra == {"exited": True}
    assert sig.subject.rank == 3
    detail = sig.evidence.detail
    assert "Ray death cause WORKER_DIED, pid 4242" in detail and "NODE_DIED" not in detail
    assert phase.removeprefix("RAY_") in detail


def test_exited_participant_on_a_silent_node_is_the_node_detectors() -> None:
    c = Cluster()
    det = HeartbeatDetector(c.policy)
    c.participant("rollout", 1, "n0", phase="EXITED")
    c.now += 20  # the node, exited participant included, went quiet
    res = c.run(1, lambda c: c.put("n1", "x", 1), detector=det)
    assert first_firing(res) is None


def test_node_silent_then_back_within_20s_does_not_fire() -> None:
    c = Cluster()
    det = NodeSilenceDetector(c.policy)
    c.run(10, lambda c: c.put("n1", "x", 1), detector=det)
    res = c.run(20, lambda c: None, detector=det)
    assert det.suspected == ["n1"]
    res += c.run(100, lambda c: c.put("n1", "x", 1), detector=det)
    assert first_firing(res) is None and det.suspected == []


def test_one_silent_node_is_medium_and_several_are_heavy() -> None:
    c = Cluster()
    det = NodeSilenceDetector(c.policy)
    c.participant("rollout", 0, "n1", phase="ROLLOUT")
    c.participant("rollout", 1, "n2", phase="ROLLOUT")
    c.run(
        5, lambda c: (c.put("n1", "x", 1), c.put("n2", "x", 1), c.put("n0", "x", 1)), detector=det
    )
    res = c.run(80, lambda c: (c.put("n2", "x", 1), c.put("n0", "x", 1)), detector=det)
    sigs = res[-1]
    assert [s.kind for s in sigs] == [FaultKind.NODE_SILENT] and sigs[
        0
    ].suggested_tier is Tier.MEDIUM
    res = c.run(80, lambda c: c.put("n0", "x", 1), detector=det)
    sigs = res[-1]
    assert [s.kind for s in sigs] == [FaultKind.NODES_LOST]
    assert sigs[0].suggested_tier is Tier.HEAVY and sigs[0].extra["nodes"] == ["n1", "n2"]


# -- a node back from an outage ----------------------------------------------------------------


def _outage_then_back(stale_after_return: int, *, rollout: bool = False):
    """n0 (a trainer, or a rollout) reports, goes quiet for 120 s with its process, comes back
    with the heartbeat written before the outage for ``stale_after_return`` s, then fresh ones.
    Returns the engine's decisions after the return and the return time."""
    from app.policy.engine import DecisionType, PolicyEngine

    c = Cluster()
    engine = PolicyEngine(c.policy)
    role, phase = ("rollout", "ROLLOUT") if rollout else ("trainer", "TRAIN")

    def healthy(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.8, gpu="0")
        c.participant(role, 0, "n0", phase=phase)
        if rollout:
            c.put("n0", m.ROLLOUT_TOKENS_PER_SECOND, 900.0, job=JOB, role=role, rank="0")

    c.run(30, healthy, engine=engine)
    stale = c.now
    before = c.run(120, lambda c: None, engine=engine)  # the node and its process stopped
    assert [d.kind for d in before if d.type is DecisionType.OPEN] == [FaultKind.NODE_SILENT]
    back = c.now + 1

    def returned_stale(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.8, gpu="0")
        c.participant(role, 0, "n0", phase=phase, heartbeat=stale)

    after = c.run(stale_after_return, returned_stale, engine=engine)
    after += c.run(120, healthy, engine=engine)
    return [d for d in after if d.type is DecisionType.OPEN], back


@pytest.mark.parametrize("rollout", [False, True], ids=["trainer", "rollout"])
def test_stale_heartbeats_in_a_returning_nodes_first_batches_open_nothing(rollout: bool) -> None:
    opened, _ = _outage_then_back(5, rollout=rollout)
    assert opened == []


def test_a_participant_still_silent_after_its_nodes_return_is_lost_counted_from_the_return() -> (
    None
):
    opened, back = _outage_then_back(200)
    lost = [d for d in opened if d.kind is FaultKind.HEARTBEAT_LOST]
    assert len(lost) == 1
    assert lost[0].at - back == pytest.approx(75, abs=1.5)
    assert lost[0].signal is not None and lost[0].signal.since == pytest.approx(back, abs=1)
    assert "counted from its node's return" in lost[0].signal.evidence.detail


def test_node_returns_remembers_a_return_only_after_a_silence_and_for_its_horizon() -> None:
    from app.policy.world import NodeReturns

    r = NodeReturns(suspect_seconds=15, horizon_seconds=150)
    assert r.update(100.0, {"n0": 99.0}) == {}  # reporting: no return
    assert r.update(120.0, {"n0": 99.0}) == {}  # quiet 21 s: silent
    assert r.update(121.0, {"n0": 120.5}) == {"n0": 120.5}  # back
    assert r.update(200.0, {"n0": 199.5}) == {"n0": 120.5}
    assert r.update(271.0, {"n0": 270.5}) == {}  # 150 s after the return: forgotten
    r.update(300.0, {"n0": 280.0})
    assert r.update(301.0, {}) == {}  # a node no longer known is forgotten too


def test_a_dead_ray_actor_reported_afresh_every_poll_is_one_occurrence() -> None:
    """Ray's collector re-reports a dead actor with a fresh heartbeat on every poll: the signal's
    ``since`` stays at the first sighting (before: a new since every tick, so the engine wrote an
    ``updated`` event and a signal row twice a second while the incident waited for approval);
    once the actor is back and dies again, that is a new occurrence."""
    c = Cluster()
    det = HeartbeatDetector(c.policy)

    def dead(c: Cluster) -> None:
        c.put("n0", m.RAY_ACTOR_DEAD, 4242, job=JOB, role="rollout", rank="0", reason="WORKER_DIED")
        c.participant("rollout", 0, "n0", phase="RAY_DEAD")  # heartbeat: now, every tick

    first = c.now + 1
    res = c.run(10, dead, detector=det)
    assert [sigs[0].since for sigs in res] == [first] * 10
    assert first_firing(c.run(5, lambda c: c.participant("rollout", 0, "n0"), detector=det)) is None
    again = c.now + 1
    assert {sigs[0].since for sigs in c.run(3, dead, detector=det)} == {again}


def test_the_engine_opens_one_incident_and_writes_no_update_for_a_dead_actor_polled() -> None:
    c = Cluster()
    engine = PolicyEngine(c.policy)

    def dead(c: Cluster) -> None:
        c.put("n0", m.RAY_ACTOR_DEAD, 4242, job=JOB, role="rollout", rank="0", reason="WORKER_DIED")
        c.participant("rollout", 0, "n0", phase="RAY_DEAD")

    decisions = c.run(20, dead, engine=engine)
    assert [d.type for d in decisions] == [DecisionType.OPEN]
