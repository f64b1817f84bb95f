"""The audit log: one row per state-changing call, by whom, on what."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class AuditEvent(SQLModel, table=True):
    __tablename__ = "audit_event"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)
    # "user:<name>", "cli", "system" or "node:<name>"
    actor: str = Field(max_length=160)
    action: str = Field(max_length=64, index=True)  # e.g. "token.create", "user.create"
    target: str = Field(default="", max_length=200)
    detail: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
