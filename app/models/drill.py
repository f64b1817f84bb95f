"""Drills: a fault injected on purpose into a running job to rehearse its recovery.

One row per ``rlguard drill``, from the request to its report. The row is the drill's whole
record: who asked, what the node's launcher answered, which incidents the fault opened (marked
as drills on their timelines and left out of the job's ETTR), and the report once the job made
a new step again or the follow-up gave up.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class DrillStatus(enum.StrEnum):
    """Where a drill is. ``requested`` and ``injected`` are the in-flight states (one per job)."""

    planned = "planned"  # --plan: the launcher described it, nothing injected
    requested = "requested"  # sent to the node's launcher (armed there with --at-step)
    refused = "refused"  # the launcher (or its node's worker) refused: nothing injected
    injected = "injected"  # the fault is in: RLGuard's detection and recovery are followed
    recovered = "recovered"  # the job made a new step after the recovery: report complete
    unrecovered = "unrecovered"  # the follow-up window ended first: the report says how far

    @classmethod
    def in_flight(cls) -> tuple[str, ...]:
        return (cls.requested.value, cls.injected.value)


class Drill(SQLModel, table=True):
    __tablename__ = "drill"

    id: int | None = Field(default=None, primary_key=True)
    job: str = Field(max_length=128, index=True)
    role: str = Field(max_length=64)
    rank: int
    node: str = Field(max_length=128)
    fault: str = Field(max_length=16)  # recovery.supervision.drills.DRILL_FAULTS
    at_step: int | None = None
    plan: bool = False
    status: str = Field(default=DrillStatus.requested.value, max_length=16, index=True)
    requested_by: str = Field(max_length=160)
    requested_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    injected_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    target_pid: int | None = None
    step_at_injection: int | None = None
    # Why it was refused or what went wrong (shown as the CLI's one line).
    reason: str = Field(default="", max_length=1000)
    # The launcher's answer as it gave it (what it did, in words), bounded by the writer.
    answer: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    # Incidents the fault opened: drills on their timelines, not faults in the ETTR.
    incident_ids: list[int] = Field(default_factory=list, sa_type=sa.JSON)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    report: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
