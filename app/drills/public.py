"""What the drills API takes and answers (the REST routes and the CLI share these)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict


class DrillCreate(BaseModel):
    """``POST /api/v1/drills``. Values are checked by :mod:`app.drills.rules` (each refusal
    names the bad value), so fields are typed loosely here: a wrong fault gets our message,
    not pydantic's."""

    model_config = ConfigDict(extra="forbid")

    job: str
    fault: str
    role: str
    rank: int | None = None
    at_step: int | None = None
    plan: bool = False


class DrillPublic(BaseModel):
    id: int
    job: str
    role: str
    rank: int
    node: str
    fault: str
    at_step: int | None
    plan: bool
    status: str
    requested_by: str
    requested_at: datetime
    injected_at: datetime | None
    target_pid: int | None
    step_at_injection: int | None
    reason: str
    # What the launcher did or would do, in words.
    what: str
    # What RLGuard is expected to do about it (the plan's second half).
    expected: str
    incident_ids: list[int]
    finished_at: datetime | None
    report: dict[str, Any]
