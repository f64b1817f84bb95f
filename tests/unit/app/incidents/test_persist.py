"""Incident, action and approval services on a migrated SQLite database (no network)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, select

from app.actions import machine as actions
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.core.lease import release_lease, try_lease
from app.incidents import approvals
from app.incidents.persist import PersistResult, persist_decisions
from app.incidents.queries import incident_detail, list_incidents, open_incident_failures
from app.models import AuditEvent, Role
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

pytestmark = pytest.mark.timeout(60)

SUBJ = Subject(node="n0", job="j", role="trainer", rank=0)


@pytest.fixture
def engine(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def decision(
    type_: DecisionType, kind: FaultKind, tier: Tier, *acts: PlannedAction, key: str | None = None
) -> IncidentDecision:
    sig = FaultSignal(kind, SUBJ, Evidence(metric="m", detail="why"), tier, 100.0, since=90.0)
    return IncidentDecision(type_, key or sig.incident_key, kind, SUBJ, tier, 100.0, sig, acts)


def heavy_plan() -> tuple[PlannedAction, PlannedAction]:
    return (
        PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False, {"reason": "x"}),
        PlannedAction(ActionName.RESTORE_CHECKPOINT, "j", None, True),
    )


def persist(engine, *ds: IncidentDecision) -> PersistResult:
    with Session(engine) as s:
        out = persist_decisions(s, decisions=list(ds), policy=default_policy())
        s.commit()
    return out


def test_open_plans_actions_and_update_does_not_duplicate(engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
    out = persist(engine, decision(DecisionType.OPEN, FaultKind.STEP_FAILED, Tier.LIGHT, skip))
    assert len(out.opened) == 1 and len(out.new_actions) == 1 and out.approvals == []
    again = persist(engine, decision(DecisionType.OPEN, FaultKind.STEP_FAILED, Tier.LIGHT, skip))
    assert again.opened == [] and again.new_actions == []  # one open incident per key
    persist(engine, decision(DecisionType.UPDATE, FaultKind.STEP_FAILED, Tier.LIGHT))
    with Session(engine) as s:
        detail = incident_detail(s, incident_id=out.opened[0])
    assert [e.type for e in detail.timeline] == ["opened", "action_planned", "updated"]
    assert len(detail.signals) == 2 and detail.detection_delay_seconds == pytest.approx(10.0)
    [a] = detail.actions
    assert (
        a.queue == "node.n0"
        and a.status == "pending"
        and a.idempotency_key.endswith("skip_failed_step:j:n0:3")
    )


def test_failed_recovery_counts_on_the_incident(engine) -> None:
    act = PlannedAction(ActionName.RESTART_ROLE, "j", "n0", False, {"role": "trainer", "rank": 0})
    out = persist(engine, decision(DecisionType.OPEN, FaultKind.HEARTBEAT_LOST, Tier.MEDIUM, act))
    [aid] = out.new_actions
    with Session(engine) as s:
        key = s.get(RecoveryAction, aid).idempotency_key
        actions.claim_action(s, action_id=aid, idempotency_key=key, worker="w", lease_seconds=30)
        actions.finish_action(s, action_id=aid, worker="w", ok=False, error="launcher exited 3")
        s.commit()
        assert open_incident_failures(s) == {
            decision(DecisionType.OPEN, FaultKind.HEARTBEAT_LOST, Tier.MEDIUM).key: 1
        }
        detail = incident_detail(s, incident_id=out.opened[0])
    assert detail.timeline[-1].type == "action_failed" and detail.timeline[-1].actor == "worker:w"


def _approver(engine, role: Role = Role.approver, name: str = "ann"):
    with Session(engine) as s:
        user, _ = create_user(s, name=name, role=role, actor="test")
        s.commit()
        s.refresh(user)
    return user


def test_heavy_plan_waits_and_decisions_are_final_and_audited(engine) -> None:
    out = persist(
        engine, decision(DecisionType.OPEN, FaultKind.STORAGE_UNWRITABLE, Tier.HEAVY, *heavy_plan())
    )
    [appr_id] = out.approvals
    assert len(out.new_actions) == 1  # only enter_safe_mode is dispatchable
    viewer = _approver(engine, Role.operator, "otto")
    ann = _approver(engine)
    with Session(engine) as s:
        with pytest.raises(Forbidden, match="needs the approver role; otto is operator"):
            approvals.decide(s, approval_id=appr_id, user=viewer, approve=True)
        with pytest.raises(NotFound):
            approvals.decide(s, approval_id=999, user=ann, approve=True)
        with pytest.raises(InvalidInput, match="at most 2000"):
            approvals.decide(s, approval_id=appr_id, user=ann, approve=True, comment="x" * 2001)
        [pending] = approvals.list_approvals(s, status="pending")
        assert [a.action for a in pending.actions] == ["restore_checkpoint"]
        res = approvals.decide(s, approval_id=appr_id, user=ann, approve=True, comment="go")
        s.commit()
        assert res.status == "approved" and res.actions[0].status == "pending"
        with pytest.raises(Conflict, match="already approved by ann; a decision is final"):
            approvals.decide(s, approval_id=appr_id, user=ann, approve=False)
        audit = s.exec(select(AuditEvent).where(AuditEvent.action == "approval.approve")).all()
        assert [(a.actor, a.target) for a in audit] == [("user:ann", f"approval:{appr_id}")]
        with pytest.raises(InvalidInput, match="status must be one of"):
            approvals.list_approvals(s, status="maybe")


def test_approval_expires_and_the_job_stays_in_safe_mode(engine) -> None:
    out = persist(
        engine, decision(DecisionType.OPEN, FaultKind.NODES_LOST, Tier.HEAVY, *heavy_plan())
    )
    [appr_id] = out.approvals
    ann = _approver(engine)
    with Session(engine) as s:
        late = s.get(Approval, appr_id).expires_at + timedelta(seconds=1)
        assert approvals.expire_approvals(s, now=late - timedelta(seconds=2)) == 0
        with pytest.raises(Conflict, match="expired .* stays in SAFE_MODE"):
            approvals.decide(s, approval_id=appr_id, user=ann, approve=True, now=late)
        detail = incident_detail(s, incident_id=out.opened[0])
    assert detail.approvals[0].status == "expired"
    assert [a.status for a in detail.actions if a.action == "restore_checkpoint"] == ["cancelled"]
    assert "SAFE_MODE" in detail.timeline[-1].detail["note"]


def test_escalation_cancels_unstarted_actions_and_plans_restart(engine) -> None:
    act = PlannedAction(ActionName.RESTART_ROLE, "j", "n0", False, {"role": "trainer", "rank": 0})
    persist(engine, decision(DecisionType.OPEN, FaultKind.HEARTBEAT_LOST, Tier.MEDIUM, act))
    esc = decision(
        DecisionType.ESCALATE,
        FaultKind.HEARTBEAT_LOST,
        Tier.HEAVY,
        PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False),
        PlannedAction(ActionName.RESTART_JOB, "j", None, True),
    )
    out = persist(engine, esc)
    with Session(engine) as s:
        inc = s.exec(select(Incident)).one()
        rows = {r.action: r.status for r in s.exec(select(RecoveryAction)).all()}
    assert inc.tier == "heavy" and inc.escalated
    assert rows == {
        "restart_role": "cancelled",
        "enter_safe_mode": "pending",
        "restart_job": "pending_approval",
    }
    assert len(out.approvals) == 1


def test_resolve_frees_the_key_for_a_new_incident(engine) -> None:
    skip = PlannedAction(ActionName.SKIP_FAILED_STEP, "j", "n0", False, {"step": 3})
    first = persist(engine, decision(DecisionType.OPEN, FaultKind.STEP_FAILED, Tier.LIGHT, skip))
    out = persist(engine, decision(DecisionType.RESOLVE, FaultKind.STEP_FAILED, Tier.LIGHT))
    assert len(out.resolved_keys) == 1
    second = persist(engine, decision(DecisionType.OPEN, FaultKind.STEP_FAILED, Tier.LIGHT, skip))
    assert second.opened and second.opened != first.opened
    with Session(engine) as s:
        listed = list_incidents(s, status="open")
        assert listed.count == 1 and listed.incidents[0].id == second.opened[0]
        for bad, needle in (
            (dict(status="closed"), "status must be"),
            (dict(tier="huge"), "tier must be"),
            (dict(limit=0), "limit must be"),
        ):
            with pytest.raises(InvalidInput, match=needle):
                list_incidents(s, **bad)
        with pytest.raises(NotFound, match="no incident with id 12345"):
            incident_detail(s, incident_id=12345)


def test_scheduler_lease_has_one_holder_until_it_expires(engine) -> None:
    assert try_lease(engine, holder="a", ttl=0.5)
    assert not try_lease(engine, holder="b", ttl=0.5)
    assert try_lease(engine, holder="a", ttl=0.5)  # renewal
    import time

    time.sleep(0.6)  # the scenario: a's 0.5 s lease runs out
    assert try_lease(engine, holder="b", ttl=5)  # a stopped renewing: b takes over
    assert not try_lease(engine, holder="a", ttl=5)
    release_lease(engine, holder="b")
    assert try_lease(engine, holder="a", ttl=5)


def _restart_job_plan() -> tuple[PlannedAction, PlannedAction]:
    return (
        PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False, {"reason": "x"}),
        PlannedAction(ActionName.RESTART_JOB, "j", None, True),
    )


def _lost(role: str) -> IncidentDecision:
    subject = Subject(node="n0", job="j", role=role, rank=0)
    sig = FaultSignal(
        FaultKind.HEARTBEAT_LOST,
        subject,
        Evidence(metric="m", detail="dead driver"),
        Tier.HEAVY,
        100.0,
        since=90.0,
    )
    return IncidentDecision(
        DecisionType.OPEN,
        sig.incident_key,
        sig.kind,
        subject,
        Tier.HEAVY,
        100.0,
        sig,
        _restart_job_plan(),
    )


def test_one_whole_job_restart_in_flight_serves_every_incident_of_the_job(engine) -> None:
    """A dead driver loses the trainer and the rollout: two incidents, one restart_job to approve
    (a second, approved after the first had brought the job back, would stop it again)."""
    trainer = persist(engine, _lost("trainer"))
    rollout = persist(engine, _lost("rollout"))
    assert len(trainer.approvals) == 1 and rollout.approvals == []  # one person asked, once
    with Session(engine) as s:
        restarts = s.exec(
            select(RecoveryAction).where(RecoveryAction.action == "restart_job")
        ).all()
        assert [r.incident_id for r in restarts] == trainer.opened
        covered = incident_detail(s, incident_id=rollout.opened[0]).timeline
        [note] = [e for e in covered if e.type == "action_covered"]
        assert note.detail["covered_by_action"] == restarts[0].id
        assert note.detail["covered_by_incident"] == trainer.opened[0]
        # the node-local SAFE_MODE entry is still planned on both (idempotent on the node)
        assert sorted(e.detail["action"] for e in covered if e.type == "action_planned") == [
            "enter_safe_mode"
        ]
        # once the covering restart is over (here: refused), a later plan of the job asks again
        approvals.decide(s, approval_id=trainer.approvals[0], user=_approver(engine), approve=False)
        s.commit()
    again = persist(engine, _lost("reference"))
    assert len(again.approvals) == 1
