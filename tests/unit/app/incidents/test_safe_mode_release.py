"""Releasing a job from SAFE_MODE: the service on a migrated SQLite database, and the adapter
that clears the control file (read by a real PhaseMachine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, func, select

from app.actions import machine as actions
from app.actions.machine import ActionSnapshot
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.incidents import approvals, safe_mode_release
from app.incidents.persist import persist_decisions
from app.incidents.queries import incident_detail
from app.models import AuditEvent, Role, User
from app.models.action import RecoveryAction
from app.models.cluster import Job
from app.models.incident import Incident
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.tasks.recovery_adapters import ActionContext, ActionError, release_safe_mode
from recovery.control import ControlMode, read_control, write_control
from recovery.phases import Event, Phase, PhaseMachine
from recovery.statelog import StateLog

pytestmark = pytest.mark.timeout(60)

SUBJ = Subject(node="n0", job="j", role="trainer", rank=0)


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    with Session(eng) as s:
        s.add(Job(name="j"))
        s.add(Job(name="calm"))
        s.commit()
    yield eng
    eng.dispose()


def _user(engine: Any, role: Role, name: str) -> User:
    with Session(engine) as s:
        user, _ = create_user(s, name=name, role=role, actor="test")
        s.commit()
        s.refresh(user)
    return user


def _run(engine: Any, action_id: int, *, ok: bool = True, error: str | None = None) -> None:
    with Session(engine) as s:
        key = s.get(RecoveryAction, action_id).idempotency_key  # type: ignore[union-attr]
        claim = actions.claim_action(
            s, action_id=action_id, idempotency_key=key, worker="w", lease_seconds=30
        )
        assert claim.outcome is actions.ClaimOutcome.claimed
        actions.finish_action(s, action_id=action_id, worker="w", ok=ok, error=error)
        s.commit()


def _heavy_in_safe_mode(engine: Any, *, decide: bool = True) -> tuple[int, int]:
    """A heavy incident whose enter_safe_mode succeeded and whose approval was rejected."""
    sig = FaultSignal(
        FaultKind.STORAGE_UNWRITABLE, SUBJ, Evidence(metric="m", detail="why"), Tier.HEAVY, 100.0
    )
    plan = (
        PlannedAction(ActionName.ENTER_SAFE_MODE, "j", "n0", False, {"reason": "x"}),
        PlannedAction(ActionName.RESTORE_CHECKPOINT, "j", None, True),
    )
    d = IncidentDecision(
        DecisionType.OPEN, sig.incident_key, sig.kind, SUBJ, Tier.HEAVY, 100.0, sig, plan
    )
    with Session(engine) as s:
        out = persist_decisions(s, decisions=[d], policy=default_policy())
        s.commit()
    [safe_id] = out.new_actions
    _run(engine, safe_id)
    [approval_id] = out.approvals
    if decide:
        ann = _user(engine, Role.approver, "rex")
        with Session(engine) as s:
            approvals.decide(s, approval_id=approval_id, user=ann, approve=False, comment="no")
            s.commit()
    return out.opened[0], approval_id


def _counts(engine: Any) -> tuple[int, int, int]:
    with Session(engine) as s:
        return (
            s.exec(select(func.count()).select_from(RecoveryAction)).one(),
            s.exec(select(func.count()).select_from(AuditEvent)).one(),
            s.exec(select(func.count()).select_from(Incident).where(Incident.safe_mode)).one(),
        )


def test_release_clears_every_safe_mode_node_then_closes_the_incident(engine: Any) -> None:
    incident_id, _ = _heavy_in_safe_mode(engine)
    ann = _user(engine, Role.approver, "ann")
    with Session(engine) as s:
        out = safe_mode_release.release_job(
            s, job="j", user=ann, comment="  disk replaced, checked  "
        )
        s.commit()
    assert (out.job, out.released_by, out.incidents) == ("j", "ann", [incident_id])
    [a] = out.actions
    assert (a.action, a.node, a.queue, a.status) == (
        "release_safe_mode",
        "n0",
        "node.n0",
        "pending",
    )
    assert a.params["reason"] == "released from SAFE_MODE by ann: disk replaced, checked"
    with Session(engine) as s:
        detail = incident_detail(s, incident_id=incident_id)
        audit = s.exec(select(AuditEvent).where(AuditEvent.action == "job.release")).one()
    assert detail.status == "open" and detail.safe_mode  # not before the node confirmed it
    assert (detail.timeline[-1].type, detail.timeline[-1].actor) == (
        "release_requested",
        "user:ann",
    )
    assert (audit.actor, audit.target) == ("user:ann", "job:j")
    assert audit.detail["comment"] == "disk replaced, checked"
    _run(engine, a.id)
    with Session(engine) as s:
        detail = incident_detail(s, incident_id=incident_id)
    assert detail.status == "resolved" and not detail.safe_mode
    released, resolved = detail.timeline[-2], detail.timeline[-1]
    assert (released.type, released.actor) == ("safe_mode_released", "user:ann")
    assert released.detail["comment"] == "disk replaced, checked"
    assert (resolved.type, resolved.actor) == ("resolved", "user:ann")
    assert "released from SAFE_MODE by ann" in resolved.detail["why"]
    # Released: a second release is refused, the job is no longer in SAFE_MODE.
    with Session(engine) as s, pytest.raises(Conflict, match="'j' is not in SAFE_MODE"):
        safe_mode_release.release_job(s, job="j", user=ann, comment="again")


def test_a_failed_release_keeps_the_job_held_is_not_a_failed_recovery_and_can_be_retried(
    engine: Any,
) -> None:
    incident_id, _ = _heavy_in_safe_mode(engine)
    admin = _user(engine, Role.admin, "root")
    with Session(engine) as s:
        first = safe_mode_release.release_job(s, job="j", user=admin, comment="try")
        s.commit()
    with Session(engine) as s, pytest.raises(Conflict, match="already on its way"):
        safe_mode_release.release_job(s, job="j", user=admin, comment="twice")
    _run(engine, first.actions[0].id, ok=False, error="run directory gone")
    with Session(engine) as s:
        inc = s.get(Incident, incident_id)
        assert inc is not None and inc.status == "open" and inc.safe_mode
        assert inc.recovery_failures == 0
        second = safe_mode_release.release_job(s, job="j", user=admin, comment="retry")
        s.commit()
    assert second.actions[0].idempotency_key == f"inc{incident_id}/release2/n0"
    _run(engine, second.actions[0].id)
    with Session(engine) as s:
        assert s.get(Incident, incident_id).status == "resolved"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("role", "job", "comment", "error", "message"),
    [
        (Role.viewer, "j", "ok", Forbidden, "needs the approver role; bob is viewer"),
        (Role.operator, "j", "ok", Forbidden, "needs the approver role; bob is operator"),
        (Role.approver, "j", "", InvalidInput, "comment must say why"),
        (Role.approver, "j", "   ", InvalidInput, "comment must say why"),
        (Role.approver, "j", "x" * 2001, InvalidInput, "comment is 2001 characters; at most 2000"),
        (Role.approver, "nope", "ok", NotFound, "no job named 'nope'"),
        (Role.approver, "calm", "ok", Conflict, "job 'calm' is not in SAFE_MODE"),
    ],
)
def test_bad_release_requests_are_refused_and_change_nothing(
    engine: Any, role: Role, job: str, comment: str, error: type[Exception], message: str
) -> None:
    _heavy_in_safe_mode(engine)
    user = _user(engine, role, "bob")
    before = _counts(engine)
    with Session(engine) as s:
        with pytest.raises(error, match=message):
            safe_mode_release.release_job(s, job=job, user=user, comment=comment)
        s.commit()
    assert _counts(engine) == before


def test_release_waits_for_a_pending_approval(engine: Any) -> None:
    _, approval_id = _heavy_in_safe_mode(engine, decide=False)
    ann = _user(engine, Role.approver, "ann")
    before = _counts(engine)
    with (
        Session(engine) as s,
        pytest.raises(Conflict, match=f"approval {approval_id} of incident .* is still pending"),
    ):
        safe_mode_release.release_job(s, job="j", user=ann, comment="now")
    assert _counts(engine) == before


def _snapshot(run_root: Path, job: str = "j") -> ActionSnapshot:
    return ActionSnapshot(
        7, 3, "release_safe_mode", job, "n0", {"reason": "released by ann: ok"}, 1, "k"
    )


def test_adapter_writes_run_and_the_phase_machine_leaves_safe_mode(tmp_path: Path) -> None:
    run_dir = tmp_path / "j"
    run_dir.mkdir()
    ctx = ActionContext(run_root=tmp_path, launcher=None, launcher_timeout=5)
    log = StateLog(run_dir / "state_log.jsonl", sync=False)
    machine = PhaseMachine(log, run_dir=run_dir)
    machine.fire(Event.START)
    machine.fire(Event.PREPARED)
    write_control(run_dir, ControlMode.SAFE_MODE, "incident 3: storage_unwritable")
    assert not machine.can_start_rollout() and machine.phase is Phase.SAFE_MODE
    result = release_safe_mode(ctx, _snapshot(tmp_path))
    assert result == {"mode": "run", "revision": 2, "already": False}
    assert read_control(run_dir).reason == "incident 3: released by ann: ok"
    assert machine.tick() is Phase.PREPARE and machine.can_start_rollout()
    # idempotent: a redelivered task changes nothing
    assert release_safe_mode(ctx, _snapshot(tmp_path)) == {
        "mode": "run",
        "revision": 2,
        "already": True,
    }
    log.close()


def test_adapter_refuses_a_missing_run_directory(tmp_path: Path) -> None:
    ctx = ActionContext(run_root=tmp_path, launcher=None, launcher_timeout=5)
    with pytest.raises(ActionError, match="run directory .*gone does not exist"):
        release_safe_mode(ctx, _snapshot(tmp_path, job="gone"))
