"""Shapes the incident, action and approval endpoints return (never table rows directly)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


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
