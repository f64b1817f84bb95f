"""Alert deliveries: one row per (incident event, channel), the unit of dedupe and of retry.

The row is written in the same transaction as the incident event it announces, before any task
is sent, and `dedupe_key` is unique: the same event can never be queued twice for a channel, not
after a worker restart, not when the incident service repeats itself. A message that groups
several events is sent by the row of its first event; the others point at it (`batch_id`) and
end as `grouped`.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class DeliveryState(enum.StrEnum):
    PENDING = "pending"  # waiting for its group window, or for a worker
    SENDING = "sending"  # a worker claimed it and is posting
    RETRYING = "retrying"  # transient failure; another try is scheduled (`next_attempt_at`)
    GROUPED = "grouped"  # carried by the message of row `batch_id`
    SENT = "sent"
    FAILED = "failed"  # transient failures until the retry budget ran out
    REJECTED = "rejected"  # the channel refused it for good (bad payload, bad URL)
    SUPPRESSED = "suppressed"  # its channel was muted or removed before it went out


OPEN_STATES = (DeliveryState.PENDING, DeliveryState.SENDING, DeliveryState.RETRYING)


class AlertDelivery(SQLModel, table=True):
    __tablename__ = "alert_delivery"
    __table_args__ = (
        sa.UniqueConstraint("dedupe_key"),
        sa.Index("ix_alert_delivery_incident_channel_state", "incident_id", "channel", "state"),
    )

    id: int | None = Field(default=None, primary_key=True)
    dedupe_key: str = Field(max_length=300)
    incident_id: int = Field(index=True)
    event_id: str = Field(max_length=100)
    event_kind: str = Field(max_length=32)
    tier: str = Field(max_length=16)
    channel: str = Field(max_length=64)
    channel_type: str = Field(max_length=16)
    # The AlertEvent as JSON: enough to render the message again after a restart.
    event: dict[str, Any] = Field(sa_type=sa.JSON)
    occurred_at: datetime = Field(sa_type=UTCDateTime)
    # When the group window of this event closes (occurred_at + group_wait).
    due_at: datetime = Field(sa_type=UTCDateTime, index=True)
    state: str = Field(default=DeliveryState.PENDING.value, max_length=16, index=True)
    batch_id: int | None = Field(default=None, foreign_key="alert_delivery.id")
    attempts: int = 0
    task_runs: int = 0
    parts_total: int = 0
    parts_sent: int = 0
    response_code: int | None = None
    last_error: str | None = Field(default=None, max_length=500)
    attempt_log: list[dict[str, Any]] = Field(default_factory=list, sa_type=sa.JSON)
    next_attempt_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    sent_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
