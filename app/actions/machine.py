"""Recovery actions: the state machine workers and the dispatcher move rows through.

pending_approval → pending → dispatched → running → succeeded | failed, or → cancelled.

A worker *claims* a row before it acts (a conditional UPDATE, atomic on SQLite and PostgreSQL,
under the write lock of ``app.core.db.begin_write``) and holds it until ``lease_until``; a redelivered task finds the row already succeeded and does
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
from sqlmodel import Session, select

from app.actions.kinds import kind_of
from app.actions.plan_order import earlier_to_run_first, superseded_by
from app.core.db import begin_write, table_of
from app.incidents.persist import resolve_incident
from app.incidents.timeline import add_event
from app.models._types import utcnow
from app.models.action import FINAL_ACTION_STATUSES, ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import Incident, IncidentEventType, IncidentStatus

log = logging.getLogger("rlguard.actions")

# How soon an approved action waiting for its plan's earlier actions tries its claim again.
PLAN_ORDER_RETRY_SECONDS = 2.0


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
    # The UPDATE below decides who runs it; the lock also keeps two claimers from both
    # cancelling a superseded row (two timeline entries) in ``_in_plan_order``.
    begin_write(session)
    row = session.get(RecoveryAction, action_id, with_for_update=True)
    if row is None or row.idempotency_key != idempotency_key:
        return Claim(
            ClaimOutcome.unknown, why=f"no action {action_id} with key {idempotency_key!r}"
        )
    if row.status in FINAL_ACTION_STATUSES:
        return Claim(ClaimOutcome.done, _snapshot(row), why=f"already {row.status}")
    if row.status == ActionStatus.pending_approval:
        return Claim(ClaimOutcome.waiting, _snapshot(row), why="waits for approval")
    ordered = _in_plan_order(session, row, worker, now)
    if ordered is not None:
        return ordered
    t = table_of(RecoveryAction)
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


def _in_plan_order(
    session: Session, row: RecoveryAction, worker: str, now: datetime
) -> Claim | None:
    """The claim's answer when the plan's order says not to run ``row`` now (``plan_order``)."""
    first = earlier_to_run_first(session, row, now)
    if first is not None:
        return Claim(
            ClaimOutcome.busy,
            _snapshot(row),
            retry_in=PLAN_ORDER_RETRY_SECONDS,
            why=f"waits for {first.action} (action {first.id}), planned before it",
        )
    later = superseded_by(session, row)
    if later is None:
        return None
    why = f"superseded: the approved {later.action} (action {later.id}) has already started"
    row.status, row.finished_at, row.error = ActionStatus.cancelled.value, now, why
    add_event(
        session,
        incident_id=row.incident_id,
        type_=IncidentEventType.ACTION_SUPERSEDED,
        actor=f"worker:{worker}",
        at=now,
        detail={"action_id": row.id, "action": row.action, "by_action": later.id},
    )
    inc = session.get(Incident, row.incident_id)
    if inc is not None:  # the approved plan may be complete now that this one is out of it
        _maybe_resolve_after_approved_plan(session, inc, now)
    return Claim(ClaimOutcome.done, _snapshot(row), why=why)


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
    t = table_of(RecoveryAction)
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
    kind = kind_of(row.action)
    if ok:
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_SUCCEEDED,
            actor=f"worker:{worker}",
            at=now,
            detail=detail,
        )
        if kind.on_succeeded is not None:
            kind.on_succeeded(session, row, inc, worker, now)
        _maybe_resolve_after_approved_plan(session, inc, now)
    else:
        if kind.failure_counts:
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
    t = table_of(RecoveryAction)
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
    t = table_of(RecoveryAction)
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
