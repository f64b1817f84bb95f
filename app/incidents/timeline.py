"""An incident's timeline: one writer for every entry, whoever records it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.alerts.service import on_incident_event
from app.models._types import utcnow
from app.models.incident import IncidentEvent, IncidentEventType


def add_event(
    session: Session,
    *,
    incident_id: int | None,
    type_: IncidentEventType,
    actor: str = "system",
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    # A type outside the vocabulary raises here rather than being stored and matching no
    # alert and no dashboard label.
    type_ = IncidentEventType(type_)
    # Callers pass ``incident.id`` of a row SQLModel types as ``int | None``; it is set once
    # the incident was flushed, which every caller has done.
    if incident_id is None:
        raise ValueError(f"{type_.value!r} event for an incident that was never flushed (no id)")
    row = IncidentEvent(
        incident_id=incident_id,
        type=type_.value,
        actor=actor,
        detail=detail or {},
        at=at or utcnow(),
    )
    session.add(row)
    # Alerts (Slack/WeCom/webhook) hang off the timeline: one call site for every entry.
    on_incident_event(session, row)
