"""Nodes, jobs and the participants (job, role, rank) that agents report."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class Node(SQLModel, table=True):
    """A machine running a node agent. Created when its first token is issued."""

    __tablename__ = "node"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=128, unique=True, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_seen_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_agent_id: str | None = Field(default=None, max_length=128)
    fingerprint: dict[str, Any] | None = Field(default=None, sa_type=sa.JSON)
    fingerprint_hash: str | None = Field(default=None, max_length=64)


class Job(SQLModel, table=True):
    """A training job, known from the participants agents report for it."""

    __tablename__ = "job"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=128, unique=True, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    last_seen_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Participant(SQLModel, table=True):
    """One process of a job (a trainer or rollout rank): its phase, step and last heartbeat."""

    __tablename__ = "participant"
    __table_args__ = (sa.UniqueConstraint("job_name", "role", "rank"),)

    id: int | None = Field(default=None, primary_key=True)
    job_name: str = Field(max_length=128, foreign_key="job.name", index=True, ondelete="CASCADE")
    role: str = Field(max_length=64)
    rank: int
    node_name: str | None = Field(default=None, max_length=128, foreign_key="node.name")
    phase: str = Field(max_length=64)
    step: int = 0
    last_heartbeat_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
