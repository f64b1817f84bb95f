"""An incident's timeline: one writer for every entry, whoever records it."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlmodel import Session, col, select

from app.alerts.service import ALERTED_EVENT_TYPES, on_incident_event
from app.models._types import utcnow
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from app.silences.muting import Mute, alert_mute


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
    # A silence, a maintenance window or a node-level incident may mute the alert: the
    # timeline says so (once per cause) and no delivery is queued.
    if type_ in ALERTED_EVENT_TYPES and _alert_muted(session, row):
        return
    # Alerts (Slack/WeCom/webhook) hang off the timeline: one call site for every entry.
    on_incident_event(session, row)


def _alert_muted(session: Session, row: IncidentEvent) -> bool:
    incident = session.get(Incident, row.incident_id)
    if incident is None:
        return False
    mute = alert_mute(session, incident, row.at)
    if mute is None:
        return False
    _record_once(session, incident, mute, row.at)
    if mute.inhibitor is not None:
        # The inhibited incident becomes evidence of the node incident: its timeline names it.
        _record_once(
            session,
            mute.inhibitor,
            Mute(
                IncidentEventType.INHIBITS,
                f"took over incident #{incident.id} ({incident.kind} on {incident.key})",
                {"incident_id": incident.id, "kind": incident.kind, "key": incident.key},
            ),
            row.at,
        )
    return True


def _record_once(session: Session, incident: Incident, mute: Mute, at: datetime) -> None:
    """One timeline entry per incident and cause (its opening, escalation and resolution are
    muted alike; the timeline need not say so three times), counted since the incident was
    last unmuted (a weekly window that mutes it again is said again: its end alerts again)."""
    types = (mute.type.value, IncidentEventType.UNMUTED.value)
    earlier = session.exec(
        select(IncidentEvent.type, IncidentEvent.detail)
        .where(IncidentEvent.incident_id == incident.id, col(IncidentEvent.type).in_(types))
        .order_by(col(IncidentEvent.id))
    ).all()
    since_unmuted: list[Mapping[str, Any]] = []
    for type_, detail in earlier:
        since_unmuted = [] if type_ == IncidentEventType.UNMUTED.value else [*since_unmuted, detail]
    if any(all(d.get(k) == v for k, v in mute.detail.items()) for d in since_unmuted):
        return
    add_event(
        session,
        incident_id=incident.id,
        type_=mute.type,
        at=at,
        detail={"text": mute.text, **mute.detail},
    )
