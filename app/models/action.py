"""Recovery actions (the outbox) and the scheduler lease."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class ActionStatus(enum.StrEnum):
    pending_approval = "pending_approval"  # heavy tier: waits for an approver
    pending = "pending"  # committed, not yet handed to the broker
    dispatched = "dispatched"  # handed to the broker
    running = "running"  # a worker holds it (until ``lease_until``)
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"  # rejected or expired approval
    # Planned under dry run (app/guardrails): shown, never sent to Celery and never claimed.
    dry_run = "dry_run"


FINAL_ACTION_STATUSES = frozenset(
    {ActionStatus.succeeded, ActionStatus.failed, ActionStatus.cancelled, ActionStatus.dry_run}
)


class RecoveryAction(SQLModel, table=True):
    """An outbox row: written in the same transaction as its incident, then sent to Celery.

    ``idempotency_key`` is unique: planning the same step twice cannot create a second row, and
    the worker uses it to make a redelivered task a no-op once the action has succeeded.
    """

    __tablename__ = "recovery_action"

    id: int | None = Field(default=None, primary_key=True)
    incident_id: int = Field(foreign_key="incident.id", index=True, ondelete="CASCADE")
    approval_id: int | None = Field(default=None, foreign_key="approval.id", index=True)
    idempotency_key: str = Field(max_length=300, unique=True)
    action: str = Field(max_length=64)
    job: str | None = Field(default=None, max_length=128)
    node: str | None = Field(default=None, max_length=128)
    queue: str = Field(max_length=160)
    params: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    status: str = Field(default=ActionStatus.pending.value, max_length=24, index=True)
    attempts: int = 0
    dispatch_count: int = 0
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    # Not sent before this (a guard-rail's backoff between restarts of one participant).
    not_before: datetime | None = Field(default=None, sa_type=UTCDateTime)
    dispatched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    lease_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    worker: str | None = Field(default=None, max_length=160)
    result: dict[str, Any] = Field(default_factory=dict, sa_type=sa.JSON)
    error: str | None = Field(default=None, max_length=2000)


class SchedulerLease(SQLModel, table=True):
    """Which server replica runs the scheduled jobs (policy tick, dispatch, retention)."""

    __tablename__ = "scheduler_lease"

    name: str = Field(primary_key=True, max_length=64)
    holder: str = Field(max_length=160)
    expires_at: datetime = Field(sa_type=UTCDateTime)
    fencing_token: int = 0
