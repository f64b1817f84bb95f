from __future__ import annotations

import pytest

from app.policy.engine import DecisionType, Occurrence, OpenIncident, PolicyEngine
from app.policy.plans import ActionName
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from recovery.protocol import metric_names as m

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(30)

T = {"job": JOB, "role": "trainer", "rank": "0"}
R = {"job": JOB, "role": "rollout", "rank": "0"}


def _base(c: Cluster) -> None:
    c.participant("trainer", 0, "n0", step=20)
    c.participant("rollout", 0, "n1", phase="ROLLOUT", step=20)
    c.put("n0", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")
    c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 1000, **R)


def test_repeated_signal_is_one_incident_and_resolves_after_quiet_period() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(5, _base, engine=e)

    def slow(c: Cluster) -> None:
        _base(c)
        c.put("n0", m.STATE_LOG_WRITE_LATENCY_MS, 900, **T)

    ds = c.run(60, slow, engine=e)
    assert [d.type for d in ds] == [DecisionType.OPEN]
    assert ds[0].kind is FaultKind.STATE_LOG_SLOW and ds[0].tier is Tier.MEDIUM
    ds = c.run(
        29, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_LATENCY_MS, 20, **T)), engine=e
    )
    assert ds == []
    ds = c.run(
        3, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_LATENCY_MS, 20, **T)), engine=e
    )
    assert [d.type for d in ds] == [DecisionType.RESOLVE] and e.open_incidents == {}


def test_new_occurrence_updates_without_a_new_plan() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(
        3, lambda c: (_base(c), c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 0, gpu="0")), engine=e
    )
    ds = c.run(
        10, lambda c: (_base(c), c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 1, gpu="0")), engine=e
    )
    assert [d.type for d in ds] == [DecisionType.OPEN]
    assert [a.action for a in ds[0].actions] == [ActionName.RESCHEDULE_BATCHES]
    ds = c.run(
        5, lambda c: (_base(c), c.put("n1", m.GPU_XID_CRITICAL_EVENTS_TOTAL, 2, gpu="0")), engine=e
    )
    assert [d.type for d in ds] == []  # same episode (within the hold): nothing new to plan
    ds = c.run(200, lambda c: _base(c), engine=e)
    assert [d.type for d in ds] == [DecisionType.RESOLVE]


def test_recovery_failing_twice_escalates_to_whole_job_restart() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _base, engine=e)
    ds = c.run(1, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e)
    [opened] = ds
    assert opened.tier is Tier.MEDIUM
    e.record_recovery_failure(opened.key)
    [retry] = c.run(1, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e)
    assert retry.type is DecisionType.RETRY and retry.tier is Tier.MEDIUM
    assert [a.action for a in retry.actions] == [
        a.action for a in opened.actions
    ]  # same local plan
    assert c.run(1, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e) == []
    e.record_recovery_failure(opened.key)
    [esc] = c.run(1, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e)
    assert esc.type is DecisionType.ESCALATE and esc.tier is Tier.HEAVY
    kinds = {(a.action, a.needs_approval) for a in esc.actions}
    assert kinds == {(ActionName.ENTER_SAFE_MODE, False), (ActionName.RESTART_JOB, True)}
    # heavy incidents wait for the approver: the signal going away does not resolve them
    assert c.run(120, _base, engine=e) == []
    e.forget(opened.key)
    assert e.open_incidents == {}


def test_failed_recovery_escalates_even_after_the_signal_went_quiet() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _base, engine=e)
    [opened] = c.run(1, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e)
    c.run(5, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 0, **T)), engine=e)
    e.record_recovery_failure(opened.key)
    e.record_recovery_failure(opened.key)
    [esc] = c.run(1, _base, engine=e)
    assert esc.type is DecisionType.ESCALATE and esc.key == opened.key


def test_rollout_down_supersedes_heartbeat_lost() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(10, _base, engine=e)
    died = c.now

    def dead(c: Cluster) -> None:
        c.participant("trainer", 0, "n0", step=20)
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.participant("rollout", 0, "n1", phase="ROLLOUT", step=20, heartbeat=died)

    ds = c.run(150, dead, engine=e)
    assert [(d.type, d.kind) for d in ds] == [(DecisionType.OPEN, FaultKind.ROLLOUT_DOWN)]
    assert {a.action for a in ds[0].actions} == {
        ActionName.RESCHEDULE_BATCHES,
        ActionName.RESTART_ROLE,
    }


def test_restored_incidents_are_not_opened_twice() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _base, engine=e)
    key = f"shard_stale:{Subject(job=JOB, role='trainer', rank=0, node='n0').key()}"
    e.restore([OpenIncident(key, FaultKind.SHARD_STALE, Subject(), Tier.MEDIUM, c.now, c.now)])
    ds = c.run(5, lambda c: (_base(c), c.put("n0", m.ACTOR_SHARD_STALE, 1, **T)), engine=e)
    assert [d.type for d in ds if d.type is DecisionType.OPEN] == []


def test_incident_closed_elsewhere_is_not_reopened_by_the_same_occurrence() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 0, **T)), engine=e)
    [opened] = c.run(
        1, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 2, **T)), engine=e
    )
    assert opened.tier is Tier.HEAVY
    e.forget(opened.key)  # the approved restore completed: the service resolved it
    assert (
        c.run(
            10, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 2, **T)), engine=e
        )
        == []
    )
    # a new occurrence (more write errors after the hold) opens a new incident
    c.run(70, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 2, **T)), engine=e)
    [again] = c.run(
        1, lambda c: (_base(c), c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 3, **T)), engine=e
    )
    assert again.type is DecisionType.OPEN and again.key == opened.key


def _storage_signal(since: float, newest: float | None = None) -> FaultSignal:
    return FaultSignal(
        FaultKind.STORAGE_UNWRITABLE,
        Subject(job=JOB, role="trainer", rank=0),
        Evidence("m"),
        Tier.HEAVY,
        detected_at=since + 1,
        since=since,
        extra={} if newest is None else {"newest_at": newest},
    )


def test_a_closed_occurrence_covers_the_same_fault_seen_by_another_detector_earlier() -> None:
    # A save that failed on a full disk: the trainer exits with ENOSPC (the exit cause, since
    # the exit at 100.0) and counted a checkpoint write error just before (since 99.0): one
    # incident key. Closed after the approved restore, the counter's signal, still in its
    # window, is that fault; a write error after the closed occurrence began is a new one.
    closed = Occurrence(100.0, None)
    assert closed.covers(_storage_signal(100.0))
    assert closed.covers(_storage_signal(99.0, newest=99.0))
    assert not closed.covers(_storage_signal(130.0, newest=130.0))
    assert not Occurrence(100.0, 99.5).covers(_storage_signal(99.0, newest=120.0))  # newer evidence
    assert not Occurrence(None).covers(_storage_signal(99.0))
    assert Occurrence(None).covers(
        FaultSignal(
            FaultKind.STORAGE_UNWRITABLE,
            Subject(job=JOB),
            Evidence("m"),
            Tier.HEAVY,
            detected_at=1.0,
        )
    )


def test_a_rollout_whose_engine_died_is_one_incident_not_also_heartbeat_lost() -> None:
    # The engine's death ends its host process a second later: both signals about rollout-1,
    # one fault, one restart_role (a second would kill the replacement the first started).
    from app.policy.root_cause import drop_superseded

    who = Subject(node="n1", job=JOB, role="rollout", rank=1)
    dead = FaultSignal(
        FaultKind.ROLLOUT_ENGINE_DEAD, who, Evidence("m"), Tier.MEDIUM, detected_at=10.0, since=9.0
    )
    lost = FaultSignal(
        FaultKind.HEARTBEAT_LOST, who, Evidence(None), Tier.MEDIUM, detected_at=11.0, since=10.0
    )
    other = FaultSignal(
        FaultKind.HEARTBEAT_LOST,
        Subject(node="n1", job=JOB, role="rollout", rank=0),
        Evidence(None),
        Tier.MEDIUM,
        detected_at=11.0,
        since=10.0,
    )
    assert drop_superseded([dead, lost, other]) == [dead, other]
    assert drop_superseded([lost]) == [lost]  # without the engine's death it is its own
