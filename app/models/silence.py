"""Silences and maintenance windows: operator-made mutes of alerts and actions.

A silence follows Alertmanager's model: label matchers, a time range, who and why. A
maintenance window names a node or a job and a one-off or weekly time range. Neither row is
ever deleted by an operator: expiring one moves its end to "now", so the audit and the
incident timelines that name it keep pointing at a row that says what it was.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class Silence(SQLModel, table=True):
    __tablename__ = "silence"

    id: int | None = Field(default=None, primary_key=True)
    # [{"label": "node", "op": "=", "value": "n0"}, ...]; app.silences.matchers reads them.
    matchers: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    starts_at: datetime = Field(sa_type=UTCDateTime)
    # Indexed: "which silences are still active" filters on it at every alert.
    ends_at: datetime = Field(sa_type=UTCDateTime, index=True)
    author: str = Field(max_length=160)
    comment: str = Field(default="", max_length=500)
    # Also hold the recovery actions of what it matches (not only the alerts).
    stops_actions: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expired_by: str | None = Field(default=None, max_length=160)


class MaintenanceWindow(SQLModel, table=True):
    __tablename__ = "maintenance_window"

    id: int | None = Field(default=None, primary_key=True)
    node: str | None = Field(default=None, max_length=128)
    job: str | None = Field(default=None, max_length=128)
    # "once": [starts_at, ends_at). "weekly": every `weekday` (0 = Monday) at `start_minute`
    # (minutes after midnight UTC) for `duration_minutes`, between starts_at and ends_at
    # (no ends_at: until expired).
    recurrence: str = Field(default="once", max_length=16)
    starts_at: datetime = Field(sa_type=UTCDateTime)
    ends_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    weekday: int | None = None
    start_minute: int | None = None
    duration_minutes: int | None = None
    author: str = Field(max_length=160)
    comment: str = Field(default="", max_length=500)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expired_by: str | None = Field(default=None, max_length=160)
