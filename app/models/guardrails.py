"""Guard-rail state that must outlive a server and be shared by replicas: circuit breakers and
each job's automation switches (app/guardrails/)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class CircuitBreaker(SQLModel, table=True):
    """One scope's breaker (``cluster`` or ``job:<name>``): while ``open`` automation stops for
    the scope, until an approver resets it. A scope that never tripped has no row."""

    __tablename__ = "circuit_breaker"

    scope: str = Field(primary_key=True, max_length=160)
    open: bool = False
    tripped_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    reason: str = Field(default="", max_length=500)
    # The incident whose plan tripped it (the one heavy incident that says why).
    incident_id: int | None = Field(default=None, foreign_key="incident.id", ondelete="SET NULL")
    trips: int = 0
    reset_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    reset_by: str | None = Field(default=None, max_length=160)


class JobAutomation(SQLModel, table=True):
    """A job's automation switches; a job without a row has both off (automation acts)."""

    __tablename__ = "job_automation"

    job_name: str = Field(
        primary_key=True, max_length=128, foreign_key="job.name", ondelete="CASCADE"
    )
    dry_run: bool = False
    hands_off: bool = False
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_by: str = Field(default="system", max_length=160)
