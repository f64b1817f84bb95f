"""Writing recovery plans to the outbox: ``write_plan`` is the only writer of action rows.

Every action row belongs to an incident and to one batch of it, the actions planned together:
the planner's stages (``s0`` for the opening plan, ``s<n>`` for each escalation or retry) and
the SAFE_MODE release's attempts (``release<n>``). A row's idempotency key is
``inc<incident>/<batch>/<name>``, so the same plan written twice collides on the key instead of
running twice, and a later plan of the same incident gets keys of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sqlmodel import Session

from app.models.action import ActionStatus, RecoveryAction
from app.models.incident import Incident
from app.policy.plans import PlannedAction


def action_key(incident_id: int, batch: str, name: str) -> str:
    return f"inc{incident_id}/{batch}/{name}"


def batch_of(idempotency_key: str) -> str:
    """``inc<incident>/<batch>``: what the actions written together share."""
    return idempotency_key.rsplit("/", 1)[0]


def write_plan(
    session: Session,
    *,
    incident: Incident,
    actions: Sequence[PlannedAction],
    batch: str,
    now: datetime,
    approval_id: int | None = None,
    name_of: Callable[[PlannedAction], str] = PlannedAction.identity,
    dry_run: Sequence[bool] = (),
    not_before: Sequence[datetime | None] = (),
) -> list[RecoveryAction]:
    """Write ``actions`` as the batch ``batch`` of ``incident``; the caller commits, then
    dispatches the rows that are ``pending``.

    An action that needs approval waits for ``approval_id`` (``pending_approval``); the others
    are ``pending``. ``name_of`` names an action inside its batch (the planner names it by
    ``PlannedAction.identity``, the release by its node). The rows are flushed (they have ids).

    ``dry_run[i]`` and ``not_before[i]`` carry the guard-rails' verdict on ``actions[i]``
    (``app.guardrails.gate``): a dry-run row is written as ``dry_run``, which the outbox never
    sends, and needs no approval; a row with ``not_before`` is not sent before then.
    """
    if incident.id is None:
        raise ValueError("actions planned for an incident that was never flushed (no id)")
    rows = []
    for i, a in enumerate(actions):
        dry = i < len(dry_run) and dry_run[i]
        if dry:
            status = ActionStatus.dry_run
        elif a.needs_approval:
            status = ActionStatus.pending_approval
        else:
            status = ActionStatus.pending
        if status is ActionStatus.pending_approval and approval_id is None:
            raise ValueError(f"{a.action.value} needs approval but no approval was requested")
        row = RecoveryAction(
            incident_id=incident.id,
            approval_id=approval_id if status is ActionStatus.pending_approval else None,
            idempotency_key=action_key(incident.id, batch, name_of(a)),
            action=a.action.value,
            job=a.job,
            node=a.node,
            queue=a.queue,
            params=dict(a.params),
            status=status.value,
            created_at=now,
            not_before=not_before[i] if i < len(not_before) else None,
        )
        session.add(row)
        session.flush()
        rows.append(row)
    return rows
