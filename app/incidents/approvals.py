"""Approvals of heavy-tier recovery plans: list, approve, reject, expire.

A decision is final: deciding an approval that is no longer pending is a conflict (409). Every
decision is written to the audit log and to the incident's timeline in the same transaction as
the change it makes. Approving releases the waiting actions to the dispatcher; rejecting (or
letting the approval expire) cancels them, and the job stays in SAFE_MODE, which the incident
says.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlmodel import Session, col, select

from app.auth.audit import record_audit
from app.core.db import begin_write
from app.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.incidents.public import ApprovalPublic, approval_public
from app.incidents.timeline import add_event
from app.models import Role, User
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import Incident, IncidentEventType

log = logging.getLogger("rlguard.approvals")

APPROVAL_STATUSES = ("pending", "approved", "rejected", "expired", "all")
MAX_COMMENT = 2000


def list_approvals(
    session: Session, *, status: str = "pending", limit: int = 100
) -> list[ApprovalPublic]:
    if status not in APPROVAL_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(APPROVAL_STATUSES)}, got {status!r}")
    if not 1 <= limit <= 1000:
        raise InvalidInput(f"limit must be 1..1000, got {limit}")
    q = select(Approval)
    if status != "all":
        q = q.where(Approval.status == status)
    rows = session.exec(q.order_by(col(Approval.id).desc()).limit(limit)).all()
    out = []
    for r in rows:
        actions = session.exec(
            select(RecoveryAction)
            .where(RecoveryAction.approval_id == r.id)
            .order_by(col(RecoveryAction.id))
        ).all()
        out.append(approval_public(r, list(actions)))
    return out


def decide(
    session: Session,
    *,
    approval_id: int,
    user: User,
    approve: bool,
    comment: str = "",
    now: datetime | None = None,
) -> ApprovalPublic:
    """Approve or reject; the caller commits. Raises Forbidden, NotFound, Conflict, InvalidInput."""
    now = now or utcnow()
    if not Role(user.role).allows(Role.approver):
        raise Forbidden(f"deciding an approval needs the approver role; {user.name} is {user.role}")
    if len(comment) > MAX_COMMENT:
        raise InvalidInput(f"comment is {len(comment)} characters; at most {MAX_COMMENT}")
    # Two approvers (or an approver and the expiry) deciding at once: the second waits here
    # and then sees the first decision (409), never a pending approval it may overwrite.
    begin_write(session)
    appr = session.get(Approval, approval_id, with_for_update=True)
    if appr is None:
        raise NotFound(f"no approval with id {approval_id}")
    if appr.status == ApprovalStatus.pending.value and appr.expires_at <= now:
        _expire(session, appr, now)
        session.commit()
        raise Conflict(
            f"approval {approval_id} expired at {appr.expires_at.isoformat()}; the job stays in SAFE_MODE"
        )
    if appr.status != ApprovalStatus.pending.value:
        who = f" by {appr.decided_by}" if appr.decided_by else ""
        raise Conflict(
            f"approval {approval_id} was already {appr.status}{who}; a decision is final"
        )
    decision = ApprovalStatus.approved if approve else ApprovalStatus.rejected
    appr.status, appr.decided_at, appr.decided_by, appr.comment = (
        decision.value,
        now,
        user.name,
        comment,
    )
    actions = session.exec(
        select(RecoveryAction).where(RecoveryAction.approval_id == appr.id)
    ).all()
    for a in actions:
        if a.status != ActionStatus.pending_approval.value:
            continue
        if approve:
            a.status = ActionStatus.pending.value
        else:
            a.status, a.finished_at, a.error = (
                ActionStatus.cancelled.value,
                now,
                "approval rejected",
            )
    inc = session.get(Incident, appr.incident_id)
    assert inc is not None
    detail = {"approval_id": appr.id, "comment": comment}
    if not approve:
        detail["note"] = (
            "job stays in SAFE_MODE; nothing was run" if inc.safe_mode else "nothing was run"
        )
    add_event(
        session,
        incident_id=inc.id,
        type_=(
            IncidentEventType.APPROVAL_GRANTED if approve else IncidentEventType.APPROVAL_REJECTED
        ),
        actor=f"user:{user.name}",
        at=now,
        detail=detail,
    )
    inc.updated_at = now
    record_audit(
        session,
        actor=f"user:{user.name}",
        action=f"approval.{'approve' if approve else 'reject'}",
        target=f"approval:{appr.id}",
        detail={"incident_id": inc.id, "comment": comment},
    )
    log.info("approval %s %s by %s", appr.id, decision.value, user.name)
    return approval_public(appr, list(actions))


def _expire(session: Session, appr: Approval, now: datetime) -> None:
    appr.status, appr.decided_at = ApprovalStatus.expired.value, now
    for a in session.exec(
        select(RecoveryAction).where(RecoveryAction.approval_id == appr.id)
    ).all():
        if a.status == ActionStatus.pending_approval.value:
            a.status, a.finished_at, a.error = ActionStatus.cancelled.value, now, "approval expired"
    inc = session.get(Incident, appr.incident_id)
    if inc is not None:
        inc.updated_at = now
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.APPROVAL_EXPIRED,
            at=now,
            detail={
                "approval_id": appr.id,
                "note": "no decision in time; the job stays in SAFE_MODE",
            },
        )
    record_audit(
        session,
        actor="system",
        action="approval.expire",
        target=f"approval:{appr.id}",
        detail={"incident_id": appr.incident_id},
    )


def expire_approvals(session: Session, *, now: datetime | None = None) -> int:
    """Expire every pending approval past its deadline; the caller commits."""
    now = now or utcnow()
    due = select(Approval).where(
        Approval.status == ApprovalStatus.pending.value, col(Approval.expires_at) <= now
    )
    # The scheduler asks often and almost always finds nothing: only then take the write lock
    # (an approver deciding now either comes first or finds it expired) and read again under it.
    if session.exec(due.limit(1)).first() is None:
        return 0
    begin_write(session)
    rows = session.exec(due.with_for_update()).all()
    for appr in rows:
        _expire(session, appr, now)
    return len(rows)
