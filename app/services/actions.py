"""Recovery actions: the state machine workers and the dispatcher move rows through.

pending_approval → pending → dispatched → running → succeeded | failed, or → cancelled.

A worker *claims* a row before it acts (a conditional UPDATE, atomic on SQLite and PostgreSQL)
and holds it until ``lease_until``; a redelivered task finds the row already succeeded and does
nothing, or finds it held and waits. A worker killed mid-action leaves a lease that runs out;
the dispatcher then sends the action again and the next claim takes over. Together with actions
that check the world before acting, that is "nothing lost, nothing done twice in effect".
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.incidents.persist import resolve_incident
from app.incidents.safe_mode_release import RELEASE_ACTION, on_release_succeeded
from app.incidents.timeline import add_event
from app.models._types import utcnow
from app.models.action import FINAL_ACTION_STATUSES, ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import Incident, IncidentEventType, IncidentStatus

log = logging.getLogger("rlguard.actions")

TASK_PREFIX = "recovery."


def task_name(action: str) -> str:
    return TASK_PREFIX + action


class ClaimOutcome(enum.StrEnum):
    claimed = "claimed"
    done = "done"  # already finished: a redelivery, nothing to do
    busy = "busy"  # another worker holds it: try again after retry_in
    waiting = "waiting"  # needs an approval first
    unknown = "unknown"  # no such action / key mismatch


@dataclass(frozen=True, slots=True)
class ActionSnapshot:
    """What a task needs to act: plain values, never an ORM object."""

    id: int
    incident_id: int
    action: str
    job: str | None
    node: str | None
    params: dict[str, Any]
    attempts: int
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    action: ActionSnapshot | None = None
    retry_in: float | None = None
    why: str = ""


def _snapshot(row: RecoveryAction) -> ActionSnapshot:
    return ActionSnapshot(
        row.id,  # type: ignore[arg-type]
        row.incident_id,
        row.action,
        row.job,
        row.node,
        dict(row.params),
        row.attempts,
        row.idempotency_key,
    )


def claim_action(
    session: Session,
    *,
    action_id: int,
    idempotency_key: str,
    worker: str,
    lease_seconds: float,
    now: datetime | None = None,
) -> Claim:
    """Take the action for ``worker`` until ``now + lease_seconds``; the caller commits."""
    now = now or utcnow()
    row = session.get(RecoveryAction, action_id)
    if row is None or row.idempotency_key != idempotency_key:
        return Claim(
            ClaimOutcome.unknown, why=f"no action {action_id} with key {idempotency_key!r}"
        )
    if row.status in FINAL_ACTION_STATUSES:
        return Claim(ClaimOutcome.done, _snapshot(row), why=f"already {row.status}")
    if row.status == ActionStatus.pending_approval:
        return Claim(ClaimOutcome.waiting, _snapshot(row), why="waits for approval")
    t = RecoveryAction.__table__  # type: ignore[attr-defined]
    result = session.execute(
        sa.update(t)
        .where(
            t.c.id == action_id,
            sa.or_(
                t.c.status.in_([ActionStatus.pending.value, ActionStatus.dispatched.value]),
                sa.and_(t.c.status == ActionStatus.running.value, t.c.lease_until < now),
            ),
        )
        .values(
            status=ActionStatus.running.value,
            worker=worker,
            started_at=now,
            lease_until=now + timedelta(seconds=lease_seconds),
            attempts=t.c.attempts + 1,
        )
    )
    session.refresh(row)
    if result.rowcount != 1:  # type: ignore[attr-defined]
        if row.status in FINAL_ACTION_STATUSES:
            return Claim(ClaimOutcome.done, _snapshot(row), why=f"already {row.status}")
        left = (row.lease_until - now).total_seconds() if row.lease_until else lease_seconds
        return Claim(
            ClaimOutcome.busy, _snapshot(row), retry_in=max(1.0, left), why=f"held by {row.worker}"
        )
    add_event(
        session,
        incident_id=row.incident_id,
        type_=IncidentEventType.ACTION_STARTED,
        actor=f"worker:{worker}",
        at=now,
        detail={"action_id": row.id, "action": row.action, "attempt": row.attempts},
    )
    return Claim(ClaimOutcome.claimed, _snapshot(row))


def finish_action(
    session: Session,
    *,
    action_id: int,
    worker: str,
    ok: bool,
    result: dict[str, Any] | None = None,
    error: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Record the outcome; False when the worker no longer holds the action (nothing written)."""
    now = now or utcnow()
    t = RecoveryAction.__table__  # type: ignore[attr-defined]
    status = ActionStatus.succeeded if ok else ActionStatus.failed
    res = session.execute(
        sa.update(t)
        .where(t.c.id == action_id, t.c.status == ActionStatus.running.value, t.c.worker == worker)
        .values(
            status=status.value,
            finished_at=now,
            lease_until=None,
            result=result or {},
            error=(error or None) and error[:2000],
        )
    )
    if res.rowcount != 1:  # type: ignore[attr-defined]
        log.warning("action %s: worker %s no longer holds it; result dropped", action_id, worker)
        return False
    row = session.get(RecoveryAction, action_id)
    assert row is not None
    session.refresh(row)
    inc = session.get(Incident, row.incident_id)
    assert inc is not None
    detail = {"action_id": row.id, "action": row.action, "node": row.node, "result": result or {}}
    if ok:
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_SUCCEEDED,
            actor=f"worker:{worker}",
            at=now,
            detail=detail,
        )
        if row.action == "enter_safe_mode" and not inc.safe_mode:
            inc.safe_mode = True
            add_event(
                session,
                incident_id=inc.id,
                type_=IncidentEventType.SAFE_MODE,
                actor=f"worker:{worker}",
                at=now,
                detail={"job": row.job, "node": row.node},
            )
        if row.action == RELEASE_ACTION:
            on_release_succeeded(session, action=row, now=now)
        _maybe_resolve_after_approved_plan(session, inc, now)
    else:
        if row.action != RELEASE_ACTION:
            # A release that failed is not a failed recovery: it must not re-plan or escalate.
            inc.recovery_failures += 1
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_FAILED,
            actor=f"worker:{worker}",
            at=now,
            detail={**detail, "error": error},
        )
    inc.updated_at = now
    return True


def renew_action_lease(
    session: Session,
    *,
    action_id: int,
    worker: str,
    lease_seconds: float,
    now: datetime | None = None,
) -> bool:
    """Extend the running worker's lease; False when it no longer holds the action.

    A worker renews while its adapter runs, so an action that takes longer than one lease (a
    slow restart, a database outage in the middle) is not claimed and run a second time by a
    redelivered task. The caller commits.
    """
    now = now or utcnow()
    t = RecoveryAction.__table__  # type: ignore[attr-defined]
    res = session.execute(
        sa.update(t)
        .where(t.c.id == action_id, t.c.status == ActionStatus.running.value, t.c.worker == worker)
        .values(lease_until=now + timedelta(seconds=lease_seconds))
    )
    return bool(res.rowcount == 1)  # type: ignore[attr-defined]


def release_for_retry(
    session: Session, *, action_id: int, worker: str, error: str, now: datetime | None = None
) -> None:
    """A transient error: give the action back so the retried task can claim it again."""
    now = now or utcnow()
    t = RecoveryAction.__table__  # type: ignore[attr-defined]
    session.execute(
        sa.update(t)
        .where(t.c.id == action_id, t.c.status == ActionStatus.running.value, t.c.worker == worker)
        .values(
            status=ActionStatus.dispatched.value,
            worker=None,
            lease_until=None,
            error=error[:2000],
            dispatched_at=now,
        )
    )


def _maybe_resolve_after_approved_plan(session: Session, inc: Incident, now: datetime) -> None:
    """A heavy incident ends when the plan its approver accepted has fully succeeded."""
    if inc.status != IncidentStatus.open.value:
        return
    approved = session.exec(
        select(Approval).where(
            Approval.incident_id == inc.id, Approval.status == ApprovalStatus.approved.value
        )
    ).all()
    if not approved:
        return
    rows = session.exec(select(RecoveryAction).where(RecoveryAction.incident_id == inc.id)).all()
    live = [r for r in rows if r.status != ActionStatus.cancelled.value]
    if live and all(r.status == ActionStatus.succeeded.value for r in live):
        resolve_incident(session, incident=inc, now=now, why="the approved recovery plan completed")


@dataclass(frozen=True, slots=True)
class DueAction:
    id: int
    idempotency_key: str
    action: str
    queue: str


def due_for_dispatch(
    session: Session,
    *,
    now: datetime | None = None,
    redispatch_after: float = 30.0,
    limit: int = 200,
) -> list[DueAction]:
    """Actions to (re)send: never sent, sent but not started in time, or whose worker's lease ran out."""
    now = now or utcnow()
    stale = now - timedelta(seconds=redispatch_after)
    rows = session.exec(
        select(RecoveryAction)
        .where(
            sa.or_(
                col(RecoveryAction.status) == ActionStatus.pending.value,
                sa.and_(
                    col(RecoveryAction.status) == ActionStatus.dispatched.value,
                    col(RecoveryAction.dispatched_at) < stale,
                ),
                sa.and_(
                    col(RecoveryAction.status) == ActionStatus.running.value,
                    col(RecoveryAction.lease_until) < now,
                    sa.or_(
                        col(RecoveryAction.dispatched_at).is_(None),
                        col(RecoveryAction.dispatched_at) < stale,
                    ),
                ),
            )
        )
        .order_by(col(RecoveryAction.id))
        .limit(limit)
    ).all()
    return [DueAction(r.id, r.idempotency_key, r.action, r.queue) for r in rows]  # type: ignore[arg-type]


def mark_dispatched(session: Session, *, action_id: int, now: datetime | None = None) -> None:
    now = now or utcnow()
    t = RecoveryAction.__table__  # type: ignore[attr-defined]
    session.execute(
        sa.update(t)
        .where(
            t.c.id == action_id,
            t.c.status.in_([ActionStatus.pending.value, ActionStatus.dispatched.value]),
        )
        .values(
            status=ActionStatus.dispatched.value,
            dispatched_at=now,
            dispatch_count=t.c.dispatch_count + 1,
        )
    )
    # A running action with an expired lease stays "running" until a worker claims it again.
    session.execute(
        sa.update(t)
        .where(t.c.id == action_id, t.c.status == ActionStatus.running.value)
        .values(dispatched_at=now, dispatch_count=t.c.dispatch_count + 1)
    )
