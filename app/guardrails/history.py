"""What automation did: the automatic action rows of a scope within a window.

Automatic means written by the planner to run without a person: no approval, and not a
SAFE_MODE release (an approver asks for those). Rows that never ran and never will (cancelled
before they started, dry run) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from app.models.action import ActionStatus, RecoveryAction
from app.policy.plans import ActionName

_NOT_COUNTED = (ActionStatus.cancelled.value, ActionStatus.dry_run.value)


@dataclass(frozen=True, slots=True)
class PastAction:
    action: str
    job: str | None
    node: str | None
    role: str | None
    rank: Any
    at: datetime


def automatic_since(
    session: Session, *, since: datetime, job: str | None = None, action: str | None = None
) -> list[PastAction]:
    """Automatic actions created after ``since``; of ``job`` and of kind ``action`` if given."""
    q = select(RecoveryAction).where(
        col(RecoveryAction.created_at) > since,
        col(RecoveryAction.approval_id).is_(None),
        col(RecoveryAction.action) != ActionName.RELEASE_SAFE_MODE.value,
        col(RecoveryAction.status).not_in(_NOT_COUNTED),
    )
    if job is not None:
        q = q.where(RecoveryAction.job == job)
    if action is not None:
        q = q.where(RecoveryAction.action == action)
    return [
        PastAction(
            action=r.action,
            job=r.job,
            node=r.node,
            role=r.params.get("role"),
            rank=r.params.get("rank"),
            at=r.created_at,
        )
        for r in session.exec(q).all()
    ]
