"""Phase transitions of job participants, as the agents' heartbeats reported them.

``Participant`` keeps only the current phase; this table keeps one row per change, so the Job
page can draw each participant's phases over time. Rows are written by the ingest group commit
(``app.ingest.phases``) and deleted after ``rollup_retention_days``.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime


class PhaseTransition(SQLModel, table=True):
    """``role``/``rank`` of ``job_name`` entered ``phase`` at ``at`` (the heartbeat's ``ts``)."""

    __tablename__ = "phase_transition"
    __table_args__ = (
        # A replayed or twice-delivered report of the same change writes nothing new.
        sa.UniqueConstraint("job_name", "role", "rank", "at"),
        sa.Index("ix_phase_transition_job_name_at", "job_name", "at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_name: str = Field(max_length=128, foreign_key="job.name", ondelete="CASCADE")
    role: str = Field(max_length=64)
    rank: int
    node_name: str | None = Field(default=None, max_length=128)
    phase: str = Field(max_length=64)
    previous_phase: str | None = Field(default=None, max_length=64)
    step: int = 0
    at: datetime = Field(sa_type=UTCDateTime, index=True)
