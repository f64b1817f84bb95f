"""An incident's timeline: one writer for every entry, whoever records it.

``add_event`` only appends. An entry worth a message is marked ``pending`` for the alert path,
which decides (mutes, queues) when it flushes (``app.incidents.alert_inbox``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.alerts.pipeline import ALERTED_EVENT_TYPES
from app.models._types import utcnow
from app.models.incident import AlertState, IncidentEvent, IncidentEventType


def add_event(
    session: Session,
    *,
    incident_id: int | None,
    type_: IncidentEventType,
    actor: str = "system",
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> IncidentEvent:
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
        alert_state=AlertState.PENDING.value if type_ in ALERTED_EVENT_TYPES else None,
    )
    session.add(row)
    return row
