"""The actions of one heavy plan run in their planned order around its approval (plan_order).

A quick approver used to let the approved restart_job (the job's release from SAFE_MODE) run
before the plan's enter_safe_mode, which then held the restarted job with its incident resolved
(seen in a clean-clone run of the Slurm reference-job test)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.machine import ClaimOutcome, claim_action, finish_action
from app.actions.plan_order import STUCK_AFTER
from app.auth.users import create_user
from app.incidents import approvals
from app.models import Role
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident, IncidentEvent
from app.policy.plans import ActionName, PlannedAction
from app.policy.signals import Tier
from tests.unit.app.actions.conftest import plan

pytestmark = pytest.mark.timeout(60)


def approved_heavy_plan(engine: Engine) -> tuple[RecoveryAction, RecoveryAction]:
    """(enter_safe_mode, restart_job) of one heavy incident, its approval given."""
    plan(
        engine,
        PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False, {"reason": "x"}),
        PlannedAction(ActionName.RESTART_JOB, "j", None, True),
        tier=Tier.HEAVY,
    )
    with Session(engine, expire_on_commit=False) as s:
        user, _ = create_user(s, name="ann", role=Role.approver, actor="test")
        s.commit()
        [appr] = s.exec(select(Approval)).all()
        approvals.decide(s, approval_id=appr.id, user=user, approve=True)  # type: ignore[arg-type]
        s.commit()
        enter, restart = s.exec(select(RecoveryAction).order_by(RecoveryAction.id)).all()  # type: ignore[arg-type]
    assert (enter.action, restart.action) == ("enter_safe_mode", "restart_job")
    assert restart.status == "pending"
    return enter, restart


def claim(engine: Engine, row: RecoveryAction, worker: str, **at: object):
    with Session(engine) as s:
        c = claim_action(
            s,
            action_id=row.id,
            idempotency_key=row.idempotency_key,  # type: ignore[arg-type]
            worker=worker,
            lease_seconds=30,
            **at,
        )  # type: ignore[arg-type]
        s.commit()
    return c


def finish(engine: Engine, row: RecoveryAction, worker: str) -> None:
    with Session(engine) as s:
        assert finish_action(s, action_id=row.id, worker=worker, ok=True)  # type: ignore[arg-type]
        s.commit()


def test_the_approved_action_waits_for_the_safe_mode_entry_planned_before_it(
    engine: Engine,
) -> None:
    enter, restart = approved_heavy_plan(engine)
    early = claim(engine, restart, "w1")
    assert early.outcome is ClaimOutcome.busy and early.retry_in, early
    assert f"waits for enter_safe_mode (action {enter.id})" in early.why
    assert claim(engine, enter, "w2").outcome is ClaimOutcome.claimed
    assert claim(engine, restart, "w1").outcome is ClaimOutcome.busy  # running, lease live
    finish(engine, enter, "w2")
    assert claim(engine, restart, "w1").outcome is ClaimOutcome.claimed
    finish(engine, restart, "w1")
    with Session(engine) as s:
        assert s.exec(select(Incident)).one().status == "resolved"


def test_a_safe_mode_entry_stuck_past_its_limit_does_not_hold_the_approved_action_and_is_then_superseded(
    engine: Engine,
) -> None:
    """Its node's worker gone (say): the approved recovery runs anyway, and the stale SAFE_MODE
    entry, claimed at last, is not run (it would hold the job the approved action restarted)."""
    enter, restart = approved_heavy_plan(engine)
    later = enter.created_at + STUCK_AFTER + timedelta(seconds=1)
    assert claim(engine, restart, "w1", now=later).outcome is ClaimOutcome.claimed
    finish(engine, restart, "w1")
    with Session(engine) as s:
        assert s.exec(select(Incident)).one().status == "open"  # its plan not over yet
    stale = claim(engine, enter, "w2", now=later)
    assert stale.outcome is ClaimOutcome.done and "superseded" in stale.why, stale
    with Session(engine) as s:
        row = s.get(RecoveryAction, enter.id)
        assert row is not None and row.status == "cancelled" and row.started_at is None
        types = [e.type for e in s.exec(select(IncidentEvent).order_by(IncidentEvent.id)).all()]
        assert "action_superseded" in types and types[-1] == "resolved", types
        assert s.exec(select(Incident)).one().status == "resolved"
