"""Approvals: a heavy-tier plan waits here for an approver's decision."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class ApprovalStatus(enum.StrEnum):
    pending = "pending"
    approved = "approved"
    rejected = "rejected"
    expired = "expired"


class Approval(SQLModel, table=True):
    __tablename__ = "approval"

    id: int | None = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    status: str = Field(default=ApprovalStatus.pending.value, max_length=16, index=True)
    summary: str = Field(default="", max_length=500)
    requested_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime)
    decided_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    decided_by: str | None = Field(default=None, max_length=64)
    comment: str = Field(default="", max_length=2000)
