"""The REST API's shapes of circuit breakers and a job's automation switches (never table rows
directly)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class BreakerPublic(BaseModel):
    scope: str
    open: bool
    tripped_at: datetime | None
    reason: str
    incident_id: int | None
    trips: int
    reset_at: datetime | None
    reset_by: str | None


class BreakerResetIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field(default="", max_length=500)


class JobAutomationPublic(BaseModel):
    job: str
    dry_run: bool
    hands_off: bool
    updated_at: datetime | None
    updated_by: str


class JobAutomationIn(BaseModel):
    """A change of a job's switches; a switch left out is unchanged. Strict booleans: a
    misspelt ``"flase"`` must be refused, not read as true."""

    model_config = ConfigDict(extra="forbid")

    dry_run: StrictBool | None = None
    hands_off: StrictBool | None = None
    reason: str = Field(default="", max_length=500)
