"""The public shapes of incidents, their actions and approvals (REST API and dashboard), and
how a row becomes one (never table rows directly)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import Incident


class IncidentEventPublic(BaseModel):
    at: datetime
    type: str
    actor: str
    detail: dict[str, Any]


class FaultSignalPublic(BaseModel):
    at: datetime
    kind: str
    tier: str
    subject: dict[str, Any]
    evidence: dict[str, Any]
    since: float | None


class ActionPublic(BaseModel):
    id: int
    action: str
    status: str
    job: str | None
    node: str | None
    queue: str
    params: dict[str, Any]
    idempotency_key: str
    attempts: int
    approval_id: int | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    result: dict[str, Any]
    error: str | None


class ApprovalPublic(BaseModel):
    id: int
    incident_id: int
    status: str
    summary: str
    requested_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    comment: str
    actions: list[ActionPublic] = []


class IncidentPublic(BaseModel):
    id: int
    key: str
    kind: str
    tier: str
    status: str
    subject: dict[str, Any]
    job: str | None
    node: str | None
    summary: str
    escalated: bool
    safe_mode: bool
    reasons: list[str]
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    detection_delay_seconds: float | None


class IncidentDetail(IncidentPublic):
    evidence: dict[str, Any]
    timeline: list[IncidentEventPublic]
    signals: list[FaultSignalPublic]
    actions: list[ActionPublic]
    approvals: list[ApprovalPublic]


class IncidentsPublic(BaseModel):
    incidents: list[IncidentPublic]
    count: int


class ApprovalDecisionIn(BaseModel):
    comment: str = ""


class JobReleaseIn(BaseModel):
    comment: str = Field(description="why the job may run again (kept in the audit log)")


class JobReleasePublic(BaseModel):
    """What ``POST /api/v1/jobs/{job}/release`` started."""

    job: str
    released_by: str
    comment: str
    incidents: list[int]
    actions: list[ActionPublic]


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
