"""The REST API's shapes of alert deliveries and channels (never table rows directly)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class AlertDeliveryPublic(BaseModel):
    id: int
    incident_id: int
    event_id: str
    event_kind: str
    tier: str
    channel: str
    channel_type: str
    state: str
    batch_id: int | None
    attempts: int
    parts_sent: int
    parts_total: int
    response_code: int | None
    last_error: str | None
    occurred_at: datetime
    due_at: datetime
    next_attempt_at: datetime | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None
    attempt_log: list[dict[str, Any]]


class AlertDeliveriesPublic(BaseModel):
    deliveries: list[AlertDeliveryPublic]
    next_before_id: int | None


class AlertChannelsPublic(BaseModel):
    channels: list[dict[str, Any]]
    group_wait_s: float
    repeat_interval_s: float
    external_base_url: str


class TestMessageResult(BaseModel):
    channel: str
    channel_type: str
    status: str
    attempts: int
    response_code: int | None
    last_error: str | None
