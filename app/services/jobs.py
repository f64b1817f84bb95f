"""Releasing a job from SAFE_MODE after its heavy incident's recovery was rejected or expired.

A heavy incident puts the job in SAFE_MODE at once (``enter_safe_mode`` writes the job's
control file on each of its nodes); the restore or restart then waits for an approver. When
the approver rejects the plan, or nobody decides in time, the job stays in SAFE_MODE. An
approver (or admin) who has looked at the job releases it here: one ``release_safe_mode``
action per node that was put in SAFE_MODE is written to the outbox (the node's worker writes
``run`` into the control file, which the phase machine obeys), and the incident is closed,
with a timeline entry naming who released it, once every one of those actions succeeded
(``app.services.actions.finish_action``).
"""

from __future__ import annotations

import logging
from datetime import datetime

from pydantic import BaseModel
from sqlmodel import Session, col, select

from app.models import Role, User
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.cluster import Job
from app.models.incident import Incident, IncidentStatus
from app.models.incident_public import ActionPublic
from app.policy.plans import ActionName, queue_for
from app.services.audit import record_audit
from app.services.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.services.incidents import action_public, add_event, resolve_incident

log = logging.getLogger("rlguard.jobs")

MAX_COMMENT = 2000
RELEASE_ACTION = ActionName.RELEASE_SAFE_MODE.value
#: Timeline entry written when the release is asked for, and when it is done.
RELEASE_REQUESTED = "release_requested"
RELEASED = "safe_mode_released"
_LIVE = (
    ActionStatus.pending.value,
    ActionStatus.dispatched.value,
    ActionStatus.running.value,
)


class JobReleasePublic(BaseModel):
    """What ``POST /api/v1/jobs/{job}/release`` started."""

    job: str
    released_by: str
    comment: str
    incidents: list[int]
    actions: list[ActionPublic]


def safe_mode_incidents(session: Session, *, job: str) -> list[Incident]:
    """Open incidents that hold ``job`` in SAFE_MODE (oldest first)."""
    return list(
        session.exec(
            select(Incident)
            .where(
                Incident.job == job,
                Incident.status == IncidentStatus.open.value,
                Incident.safe_mode == True,  # noqa: E712 - a SQL comparison
            )
            .order_by(col(Incident.id))
        ).all()
    )


def release_job(
    session: Session,
    *,
    job: str,
    user: User,
    comment: str,
    now: datetime | None = None,
) -> JobReleasePublic:
    """Plan the release of ``job`` from SAFE_MODE; the caller commits.

    Raises Forbidden (not approver/admin), InvalidInput (no comment, or too long), NotFound
    (unknown job) and Conflict (not in SAFE_MODE, an approval still pending, a release already
    on its way). Nothing is written when it raises.
    """
    now = now or utcnow()
    if not Role(user.role).allows(Role.approver):
        raise Forbidden(f"releasing a job needs the approver role; {user.name} is {user.role}")
    if not isinstance(comment, str) or not comment.strip():
        raise InvalidInput("comment must say why the job is released (got an empty comment)")
    if len(comment) > MAX_COMMENT:
        raise InvalidInput(f"comment is {len(comment)} characters; at most {MAX_COMMENT}")
    if session.exec(select(Job).where(Job.name == job)).first() is None:
        raise NotFound(f"no job named {job!r}")
    incidents = safe_mode_incidents(session, job=job)
    if not incidents:
        raise Conflict(f"job {job!r} is not in SAFE_MODE (no open incident holds it there)")
    ids = [inc.id for inc in incidents]
    pending = session.exec(
        select(Approval).where(
            col(Approval.incident_id).in_(ids), Approval.status == ApprovalStatus.pending.value
        )
    ).first()
    if pending is not None:
        raise Conflict(
            f"approval {pending.id} of incident {pending.incident_id} is still pending: "
            "approve or reject it before releasing the job"
        )
    rows = session.exec(
        select(RecoveryAction).where(col(RecoveryAction.incident_id).in_(ids))
    ).all()
    running = [r for r in rows if r.action == RELEASE_ACTION and r.status in _LIVE]
    if running:
        raise Conflict(
            f"a release of job {job!r} is already on its way (action {running[0].id}, "
            f"{running[0].status})"
        )
    actor = f"user:{user.name}"
    reason = f"released from SAFE_MODE by {user.name}: {comment.strip()}"
    planned: list[RecoveryAction] = []
    for inc in incidents:
        nodes = sorted(
            {
                r.node
                for r in rows
                if r.incident_id == inc.id
                and r.action == ActionName.ENTER_SAFE_MODE.value
                and r.status == ActionStatus.succeeded.value
                and r.node
            }
        )
        attempt = 1 + sum(1 for r in rows if r.incident_id == inc.id and r.action == RELEASE_ACTION)
        for node in nodes:
            row = RecoveryAction(
                incident_id=inc.id,  # type: ignore[arg-type]
                idempotency_key=f"inc{inc.id}/release{attempt}/{node}",
                action=RELEASE_ACTION,
                job=job,
                node=node,
                queue=queue_for(ActionName.RELEASE_SAFE_MODE, node),
                params={"reason": reason, "released_by": user.name, "comment": comment.strip()},
                status=ActionStatus.pending.value,
                created_at=now,
            )
            session.add(row)
            planned.append(row)
        session.flush()
        add_event(
            session,
            incident_id=inc.id,  # type: ignore[arg-type]
            type_=RELEASE_REQUESTED,
            actor=actor,
            at=now,
            detail={
                "comment": comment.strip(),
                "nodes": nodes,
                "action_ids": [r.id for r in planned if r.incident_id == inc.id],
            },
        )
        inc.updated_at = now
        if not nodes:
            # SAFE_MODE was recorded without a node (an older incident): nothing to clear.
            _close_released(session, inc, user_name=user.name, comment=comment.strip(), now=now)
    record_audit(
        session,
        actor=actor,
        action="job.release",
        target=f"job:{job}",
        detail={"incidents": ids, "comment": comment.strip(), "actions": [r.id for r in planned]},
    )
    log.info("job %s: release from SAFE_MODE requested by %s", job, user.name)
    return JobReleasePublic(
        job=job,
        released_by=user.name,
        comment=comment.strip(),
        incidents=ids,  # type: ignore[arg-type]
        actions=[action_public(r) for r in planned],
    )


def on_release_succeeded(session: Session, *, action: RecoveryAction, now: datetime) -> None:
    """A node's control file says ``run`` again: close the incident once all its nodes do."""
    inc = session.get(Incident, action.incident_id)
    if inc is None or inc.status != IncidentStatus.open.value:
        return
    key = action.idempotency_key.rsplit("/", 1)[0] + "/"
    batch = [
        r
        for r in session.exec(
            select(RecoveryAction).where(
                RecoveryAction.incident_id == inc.id, RecoveryAction.action == RELEASE_ACTION
            )
        ).all()
        if r.idempotency_key.startswith(key)
    ]
    if all(r.status == ActionStatus.succeeded.value for r in batch):
        params = action.params or {}
        _close_released(
            session,
            inc,
            user_name=str(params.get("released_by", "unknown")),
            comment=str(params.get("comment", "")),
            now=now,
        )


def _close_released(
    session: Session, inc: Incident, *, user_name: str, comment: str, now: datetime
) -> None:
    inc.safe_mode = False
    add_event(
        session,
        incident_id=inc.id,  # type: ignore[arg-type]
        type_=RELEASED,
        actor=f"user:{user_name}",
        at=now,
        detail={"job": inc.job, "released_by": user_name, "comment": comment},
    )
    resolve_incident(
        session,
        incident=inc,
        now=now,
        why=f"released from SAFE_MODE by {user_name}: {comment}",
        actor=f"user:{user_name}",
    )

