"""A fault that comes back after its recovery succeeded is acted on again, never only recorded.

Found by the TRL benchmark: a participant restarted by a successful ``restart_role`` crashed a
second time while its incident was still open (inside the quiet period), and the engine only
wrote "updated" on the timeline: nothing was planned and the job stayed down.

The rule (app.policy.engine): a recovery that did not hold (the incident's newest plan
succeeded, its signal went quiet, and the signal is back) counts as a failed local recovery.
The first is planned again (a new plan stage, so new idempotency keys); failing again reaches
``escalation.local_recovery_failures`` and escalates to heavy (DESIGN.md, "Escalation"). While
the plan is still pending or running nothing more is planned.

The scheduler tests drive the real ``PolicyScheduler.tick`` on a migrated SQLite database, with
the action moved through the real claim/finish services a worker uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.actions import machine as actions
from app.core import migrate
from app.core.db import make_engine
from app.models.action import RecoveryAction
from app.models.incident import Incident, IncidentEvent
from app.policy.clock import ManualClock
from app.policy.engine import DecisionType, PolicyEngine
from app.policy.plans import ActionName
from app.policy.signals import Tier
from app.scheduler import PolicyScheduler
from recovery.protocol import metric_names as m

from ._helpers import Cluster

pytestmark = pytest.mark.timeout(30)


def _alive(c: Cluster) -> None:
    c.participant("trainer", 0, "n0", step=20)
    c.put("n0", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")


def _exited(at: float):
    """The launcher saw the trainer exit at ``at`` (phase EXITED); the node still reports."""

    def feed(c: Cluster) -> None:
        c.participant("trainer", 0, "n0", phase="EXITED", step=20, heartbeat=at)
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")

    return feed


# -- the engine alone ---------------------------------------------------------------------------


def _crash(c: Cluster, e: PolicyEngine, seconds: int = 2) -> list:
    return c.run(seconds, _exited(c.now + 1), engine=e)


def test_engine_replans_a_fault_back_after_its_recovery_succeeded_then_escalates() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _alive, engine=e)
    [opened] = _crash(c, e)
    assert opened.type is DecisionType.OPEN
    assert [a.action for a in opened.actions] == [ActionName.RESTART_ROLE]
    e.set_plan_succeeded(opened.key, True)  # what the scheduler syncs from the database
    assert c.run(5, _alive, engine=e) == []  # recovered, still inside the quiet period
    [again] = _crash(c, e)
    assert again.type is DecisionType.RETRY and again.key == opened.key
    assert again.recovery_did_not_hold
    assert [a.action for a in again.actions] == [ActionName.RESTART_ROLE]
    assert e.open_incidents[opened.key].recovery_failures == 1
    e.set_plan_succeeded(opened.key, True)
    c.run(5, _alive, engine=e)
    [esc] = _crash(c, e)
    assert esc.type is DecisionType.ESCALATE and esc.tier is Tier.HEAVY
    assert esc.recovery_did_not_hold
    assert {a.action for a in esc.actions} == {ActionName.ENTER_SAFE_MODE, ActionName.RESTART_JOB}


def test_engine_plans_nothing_more_while_the_plan_has_not_succeeded() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _alive, engine=e)
    [opened] = _crash(c, e)
    c.run(5, _alive, engine=e)
    ds = _crash(c, e)  # the restart is still pending or running
    assert [d.type for d in ds] == [DecisionType.UPDATE]
    assert [d for d in ds if d.actions] == []


def test_engine_does_not_count_a_fault_that_never_went_away() -> None:
    # Ray reports a dead actor with a fresh timestamp every round while it stays down (its
    # signal keeps the since of the first sighting: one occurrence). After the restart
    # "succeeded" that is not a recurrence (the recovery never held): nothing is decided,
    # counted or escalated.
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _alive, engine=e)
    [opened] = _crash(c, e)
    e.set_plan_succeeded(opened.key, True)
    ds: list = []
    for _ in range(5):
        ds += _crash(c, e, seconds=1)
    assert ds == []
    assert e.open_incidents[opened.key].recovery_failures == 0


# -- the scheduler and the database ---------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _scheduler(db: Engine, c: Cluster) -> PolicyScheduler:
    return PolicyScheduler(
        engine=db,
        store=c.store,
        participants=lambda: list(c.participants.values()),
        dispatcher=None,
        policy=c.policy,
        clock=ManualClock(c.now),
    )


def _run(sched: PolicyScheduler, c: Cluster, seconds: int, feed) -> None:
    for _ in range(seconds):
        c.now += 1.0
        feed(c)
        sched.clock.advance_to(c.now)  # type: ignore[attr-defined]
        assert sched.tick() is not None  # this replica holds the lease


def _crash_under(sched: PolicyScheduler, c: Cluster) -> float:
    """The trainer exits at the next second; returns when (its EXITED heartbeat's time)."""
    at = c.now + 1
    _run(sched, c, 2, _exited(at))
    return at


def _actions(db: Engine) -> list[RecoveryAction]:
    with Session(db) as s:
        return list(s.exec(select(RecoveryAction).order_by(col(RecoveryAction.id))).all())


def _incident(db: Engine) -> tuple[Incident, list[str]]:
    with Session(db) as s:
        [inc] = s.exec(select(Incident)).all()
        events = s.exec(
            select(IncidentEvent.type)
            .where(IncidentEvent.incident_id == inc.id)
            .order_by(col(IncidentEvent.id))
        ).all()
        return inc, list(events)


def _claim(db: Engine, row: RecoveryAction, worker: str = "w") -> None:
    with Session(db) as s:
        claim = actions.claim_action(
            s,
            action_id=row.id,
            idempotency_key=row.idempotency_key,
            worker=worker,
            lease_seconds=60,
        )
        assert claim.outcome is actions.ClaimOutcome.claimed
        s.commit()


def _finish(db: Engine, row: RecoveryAction, worker: str = "w") -> None:
    with Session(db) as s:
        assert actions.finish_action(s, action_id=row.id, worker=worker, ok=True, result={})
        s.commit()


def _succeed(db: Engine, row: RecoveryAction) -> None:
    _claim(db, row)
    _finish(db, row)


def test_second_crash_after_a_successful_restart_is_restarted_again_then_escalated(
    db: Engine,
) -> None:
    c = Cluster()
    sched = _scheduler(db, c)
    _run(sched, c, 3, _alive)
    _crash_under(sched, c)
    [first] = _actions(db)
    assert first.action == ActionName.RESTART_ROLE.value and first.status == "pending"
    _succeed(db, first)
    _run(sched, c, 5, _alive)  # back, and well inside the 30 s quiet period
    inc, _ = _incident(db)
    assert inc.status == "open"

    crashed = _crash_under(sched, c)
    rows = _actions(db)
    assert [(r.action, r.status) for r in rows] == [
        (ActionName.RESTART_ROLE.value, "succeeded"),
        (ActionName.RESTART_ROLE.value, "pending"),
    ]
    assert rows[1].idempotency_key != rows[0].idempotency_key
    assert rows[1].params == rows[0].params
    inc, events = _incident(db)
    assert inc.status == "open" and inc.recovery_failures == 1 and inc.tier == Tier.MEDIUM.value
    assert events[-3:] == ["recovery_did_not_hold", "recovery_retry", "action_planned"]
    # the next ticks (the trainer still down, the new restart pending) plan nothing more
    _run(sched, c, 3, _exited(crashed))
    assert len(_actions(db)) == 2

    # the retried restart succeeds, and the trainer crashes once more: escalated to heavy
    _succeed(db, rows[1])
    _run(sched, c, 5, _alive)
    _crash_under(sched, c)
    inc, events = _incident(db)
    assert inc.tier == Tier.HEAVY.value and inc.escalated and inc.recovery_failures == 2
    assert "escalated" in events
    late = _actions(db)[2:]
    assert {(r.action, r.status) for r in late} == {
        (ActionName.ENTER_SAFE_MODE.value, "pending"),
        (ActionName.RESTART_JOB.value, "pending_approval"),
    }


@pytest.mark.parametrize("state", ["pending", "running"])
def test_no_second_plan_while_the_first_restart_is_pending_or_running(
    db: Engine, state: str
) -> None:
    c = Cluster()
    sched = _scheduler(db, c)
    _run(sched, c, 3, _alive)
    _crash_under(sched, c)
    [first] = _actions(db)
    if state == "running":
        _claim(db, first)
    _run(sched, c, 5, _alive)
    crashed = _crash_under(sched, c)
    _run(sched, c, 3, _exited(crashed))
    assert [r.status for r in _actions(db)] == [state]
    inc, events = _incident(db)
    assert "updated" in events and "recovery_did_not_hold" not in events
    assert inc.recovery_failures == 0

    # The restart then reports success while the trainer is down again: that recovery did
    # not hold, so it is planned once more, exactly once.
    if state == "pending":
        _claim(db, first)
    _finish(db, first)
    _run(sched, c, 5, _exited(crashed))
    rows = _actions(db)
    assert [(r.action, r.status) for r in rows] == [
        (ActionName.RESTART_ROLE.value, "succeeded"),
        (ActionName.RESTART_ROLE.value, "pending"),
    ]
