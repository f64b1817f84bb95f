"""The public shapes of incidents, their actions and approvals (REST API and dashboard)."""

from __future__ import annotations

from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident
from app.models.incident_public import ActionPublic, ApprovalPublic, IncidentPublic


def incident_public(inc: Incident) -> IncidentPublic:
    return IncidentPublic(
        id=inc.id,  # type: ignore[arg-type]
        key=inc.key,
        kind=inc.kind,
        tier=inc.tier,
        status=inc.status,
        subject=inc.subject,
        job=inc.job,
        node=inc.node,
        summary=inc.summary,
        escalated=inc.escalated,
        safe_mode=inc.safe_mode,
        reasons=inc.reasons,
        opened_at=inc.opened_at,
        updated_at=inc.updated_at,
        resolved_at=inc.resolved_at,
        detection_delay_seconds=inc.detection_delay_seconds,
    )


def action_public(row: RecoveryAction) -> ActionPublic:
    return ActionPublic(
        id=row.id,  # type: ignore[arg-type]
        action=row.action,
        status=row.status,
        job=row.job,
        node=row.node,
        queue=row.queue,
        params=row.params,
        idempotency_key=row.idempotency_key,
        attempts=row.attempts,
        approval_id=row.approval_id,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker=row.worker,
        result=row.result,
        error=row.error,
    )


def approval_public(row: Approval, actions: list[RecoveryAction] | None = None) -> ApprovalPublic:
    return ApprovalPublic(
        id=row.id,  # type: ignore[arg-type]
        incident_id=row.incident_id,
        status=row.status,
        summary=row.summary,
        requested_at=row.requested_at,
        expires_at=row.expires_at,
        decided_at=row.decided_at,
        decided_by=row.decided_by,
        comment=row.comment,
        actions=[action_public(a) for a in actions or []],
    )
