"""The actions of one incident's plan run in their planned order around an approval.

A heavy plan is written as, for example, ``enter_safe_mode`` (runs at once) then ``restart_job``
(waits for an approver), and the approved action is also the job's release from SAFE_MODE. Both
go to Celery as soon as the approval is given, on different queues, and nothing made the worker
run them in order: seen in a clean-clone run, an approver quick to approve (0.7 s) let
``restart_job`` release and requeue the job before ``enter_safe_mode`` ran, which then put the
restarted job in SAFE_MODE with its incident resolved and nobody left to release it.

So, at claim time (``app.actions.machine.claim_action``):

- an approved action waits while an action of its incident planned before it without an
  approval is still to run: pending or dispatched and planned less than ``STUCK_AFTER`` ago
  (older, its worker is gone, e.g. the node of a node-local action was lost: waiting for it
  would keep the approved recovery from ever running), or running under a live lease;
- an action without an approval claimed after an approved action of its incident planned after
  it has started is superseded by it and does not run (the approved action already acted on the
  job, SAFE_MODE entered now would undo its release).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.models.action import ActionStatus, RecoveryAction

STUCK_AFTER = timedelta(seconds=60)


def earlier_to_run_first(
    session: Session, row: RecoveryAction, now: datetime
) -> RecoveryAction | None:
    """For an approved ``row``: the unapproved action of its incident it must wait for."""
    if row.approval_id is None:
        return None
    for other in _unapproved_before(session, row):
        if other.status in (ActionStatus.pending.value, ActionStatus.dispatched.value):
            if other.created_at > now - STUCK_AFTER:
                return other
        elif other.status == ActionStatus.running.value and other.lease_until is not None:
            if other.lease_until > now:
                return other
    return None


def superseded_by(session: Session, row: RecoveryAction) -> RecoveryAction | None:
    """For an unapproved ``row``: the approved action of its incident, planned after it, that
    has already started."""
    if row.approval_id is not None:
        return None
    return session.exec(
        select(RecoveryAction)
        .where(
            RecoveryAction.incident_id == row.incident_id,
            col(RecoveryAction.id) > row.id,
            col(RecoveryAction.approval_id).is_not(None),
            col(RecoveryAction.started_at).is_not(None),
        )
        .order_by(col(RecoveryAction.id))
    ).first()


def _unapproved_before(session: Session, row: RecoveryAction) -> list[RecoveryAction]:
    return list(
        session.exec(
            select(RecoveryAction)
            .where(
                RecoveryAction.incident_id == row.incident_id,
                col(RecoveryAction.id) < row.id,
                col(RecoveryAction.approval_id).is_(None),
                col(RecoveryAction.status).in_(
                    [
                        ActionStatus.pending.value,
                        ActionStatus.dispatched.value,
                        ActionStatus.running.value,
                    ]
                ),
            )
            .order_by(col(RecoveryAction.id))
        ).all()
    )
