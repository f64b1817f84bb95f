"""Training progress over time: when each job's step counter moved, as its reports said.

``Participant`` keeps only the current step and ``PhaseTransition`` only phase changes (a fast
job can finish several steps without its sampled phase changing), so the goodput ledger could
not tell when a job made progress again after a fault. One row per change of step of a role's
rank 0 (the rank that speaks for its role: data-parallel ranks move in lock-step), written by
the ingest group commit (``app.ingest.step_progress``) and deleted with the phase transitions.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime


class StepProgress(SQLModel, table=True):
    """``role`` rank ``rank`` of ``job_name`` reported ``step`` (completed steps) first at ``at``."""

    __tablename__ = "step_progress"
    __table_args__ = (
        # A replayed or twice-delivered report of the same change writes nothing new.
        sa.UniqueConstraint("job_name", "role", "rank", "at"),
        sa.Index("ix_step_progress_job_name_at", "job_name", "at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_name: str = Field(max_length=128, foreign_key="job.name", ondelete="CASCADE")
    role: str = Field(max_length=64)
    rank: int
    step: int
    at: datetime = Field(sa_type=UTCDateTime, index=True)
