"""What the REST API and the CLI send and get back for silences and maintenance windows. The
Create models only type the fields; :mod:`app.silences.store` validates them (the CLI goes through
the same checks as the API)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from pydantic import Field as PydField


class MatcherIn(BaseModel):
    label: str
    op: str = "="
    value: str


class SilenceCreate(BaseModel):
    matchers: list[MatcherIn]
    # Unset: now. Give either ends_at or duration_minutes.
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    duration_minutes: float | None = None
    comment: str = PydField(default="", max_length=500)
    stops_actions: bool = False


class SilencePublic(BaseModel):
    id: int
    matchers: list[dict[str, Any]]
    starts_at: datetime
    ends_at: datetime
    author: str
    comment: str
    stops_actions: bool
    created_at: datetime
    expired_by: str | None
    state: str  # pending, active, expired


class MaintenanceWindowCreate(BaseModel):
    node: str | None = PydField(default=None, max_length=128)
    job: str | None = PydField(default=None, max_length=128)
    recurrence: str = "once"
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    # weekly only
    weekday: int | None = None
    start_time: str | None = None  # "HH:MM", UTC
    duration_minutes: int | None = None
    comment: str = PydField(default="", max_length=500)


class MaintenanceWindowPublic(BaseModel):
    id: int
    node: str | None
    job: str | None
    recurrence: str
    starts_at: datetime
    ends_at: datetime | None
    weekday: int | None
    start_minute: int | None
    duration_minutes: int | None
    author: str
    comment: str
    created_at: datetime
    expired_by: str | None
    state: str  # open, scheduled, expired
