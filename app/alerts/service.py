"""Alerts, as the rest of the server sees them.

The incident service calls `on_incident_event` for every timeline entry it adds (one call
site, in `app.incidents.timeline.add_event`); the REST routes call `list_deliveries` and
`send_test_message`. The queue itself lives in `app.alerts.queue`; its rows reach Celery
through the outbox dispatcher (`app.actions.outbox`), as recovery actions do, and are sent by
the task in `app.tasks.alert_tasks` (`app.alerts.sender` on the worker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.alerts.config import AlertsConfig
from app.alerts.delivery import AlertDeliveryClient, DeliveryRecord, RetryPolicy
from app.alerts.errors import AlertEventError
from app.alerts.events import AlertEvent, Decision, EventKind
from app.alerts.queue import actions_taken, purge_old_deliveries, queue_events, queue_reminders
from app.alerts.render import render_test_message
from app.core.db import begin_savepoint
from app.models._types import utcnow
from app.models.alert import AlertDelivery, DeliveryState
from app.models.incident import Incident, IncidentEvent, IncidentEventType, IncidentStatus
from app.policy.signals import Tier

log = logging.getLogger("rlguard.alerts.service")


# Timeline entries (IncidentEvent.type) that are worth a message, and what they become.
_TIMELINE: dict[str, tuple[EventKind, Decision | None]] = {
    IncidentEventType.OPENED: (EventKind.OPENED, None),
    # Alertmanager's rule: an alert still firing when its silence ends is sent then.
    IncidentEventType.UNMUTED: (EventKind.OPENED, None),
    IncidentEventType.ESCALATED: (EventKind.ESCALATED, None),
    IncidentEventType.APPROVAL_REQUESTED: (EventKind.APPROVAL_REQUESTED, None),
    IncidentEventType.APPROVAL_GRANTED: (EventKind.APPROVAL_DECIDED, Decision.APPROVED),
    IncidentEventType.APPROVAL_REJECTED: (EventKind.APPROVAL_DECIDED, Decision.REJECTED),
    IncidentEventType.APPROVAL_EXPIRED: (EventKind.APPROVAL_DECIDED, Decision.EXPIRED),
    IncidentEventType.ACTION_FAILED: (EventKind.ACTION_FAILED, None),
    IncidentEventType.RESOLVED: (EventKind.RESOLVED, None),
}

# The timeline entries that may raise an alert: the incident writer asks the silences only
# about these (app.incidents.timeline).
ALERTED_EVENT_TYPES = frozenset(IncidentEventType(t) for t in _TIMELINE)

_runtime: dict[str, Any] = {"config": None}


def configure(*, config: AlertsConfig | None) -> None:
    """Set the configuration used by `on_incident_event` (server/worker start-up, tests); unset,
    it is loaded lazily from the settings."""
    _runtime["config"] = config


def current_config() -> AlertsConfig:
    if _runtime["config"] is None:
        from app.alerts.settings import load_server_alerts_config
        from app.core.config import get_settings

        settings = get_settings()
        _runtime["config"] = load_server_alerts_config(settings)
    config: AlertsConfig = _runtime["config"]
    return config


def alert_event_for(session: Session, row: IncidentEvent) -> AlertEvent | None:
    """The AlertEvent a timeline entry becomes, or None when it is not worth a message."""
    mapped = _TIMELINE.get(row.type)
    incident = session.get(Incident, row.incident_id)
    if mapped is None or incident is None or row.id is None:
        return None
    kind, decision = mapped
    detail = row.detail or {}
    approval_id = detail.get("approval_id")
    actor = row.actor or ""
    return AlertEvent(
        incident_id=int(row.incident_id),
        event_id=f"t{row.id}",
        kind=kind,
        tier=Tier(incident.tier),
        occurred_at=row.at,
        fault_kind=incident.kind,
        job=incident.job,
        node=incident.node,
        role=(incident.subject or {}).get("role"),
        evidence_summary=incident.summary or "",
        actions_taken=actions_taken(session, int(row.incident_id)),
        approval_id=approval_id if isinstance(approval_id, int) else None,
        decision=decision,
        decided_by=actor.removeprefix("user:") if actor.startswith("user:") else None,
        comment=str(detail.get("comment") or "") or None,
        failed_action=str(detail["action"])
        if kind is EventKind.ACTION_FAILED and "action" in detail
        else None,
        error=str(detail["error"]) if detail.get("error") else None,
        incident_opened_at=incident.opened_at,
    )


def on_incident_event(session: Session, row: IncidentEvent) -> None:
    """Queue the alerts for one new timeline entry, in the caller's transaction.

    Called by the incident service for every entry it adds; entries that are not worth a
    message cost nothing. Alerting must never block the policy engine: a failure here is
    logged and the incident goes on. The outbox dispatcher hands the rows to Celery once the
    caller committed.
    """
    if row.type not in _TIMELINE:
        return
    try:
        config = current_config()
    except Exception:
        log.exception(
            "alerts configuration unusable; incident %s (%s) not alerted", row.incident_id, row.type
        )
        return
    if not config.channels:
        return
    # The caller's own pending rows are flushed outside our savepoint, so that rolling our
    # savepoint back could never take their rows with it.
    session.flush()
    try:
        with begin_savepoint(session):
            event = alert_event_for(session, row)
            if event is None:
                return
            queue_events(session, events=[event], config=config, now=utcnow())
    except Exception:
        log.exception(
            "alerts for incident %s (%s) not queued; the incident goes on",
            row.incident_id,
            row.type,
        )
        return


def list_deliveries(
    session: Session,
    *,
    incident_id: int | None = None,
    channel: str | None = None,
    state: str | None = None,
    limit: int = 100,
    before_id: int | None = None,
) -> list[AlertDelivery]:
    """Newest first; `before_id` pages backwards."""
    if state is not None and state not in {s.value for s in DeliveryState}:
        allowed = ", ".join(s.value for s in DeliveryState)
        raise AlertEventError(f"state={state!r} is not one of: {allowed}")
    if not 1 <= limit <= 1000:
        raise AlertEventError(f"limit={limit} must be between 1 and 1000")
    d = AlertDelivery
    query = select(d)
    if incident_id is not None:
        query = query.where(d.incident_id == incident_id)
    if channel is not None:
        query = query.where(d.channel == channel)
    if state is not None:
        query = query.where(d.state == state)
    if before_id is not None:
        query = query.where(d.id < before_id)  # type: ignore[operator]
    return list(session.exec(query.order_by(d.id.desc()).limit(limit)).all())  # type: ignore[union-attr]


def send_test_message(
    *, config: AlertsConfig, channel: str, now: datetime, policy: RetryPolicy | None = None
) -> DeliveryRecord:
    """Send a harmless test message to one channel (even a muted one: an admin asked)."""
    target = config.channel(channel)
    message = render_test_message(channel=target, config=config, now=now)
    with AlertDeliveryClient(config, policy=policy) as client:
        return client.send(target.name, message)


def _incident_is_open(session: Session) -> Callable[[int], bool]:
    def is_open(incident_id: int) -> bool:
        incident = session.get(Incident, incident_id)
        return incident is not None and incident.status == IncidentStatus.open.value

    return is_open


def run_alert_maintenance(engine: Engine, *, now: datetime | None = None) -> int:
    """The periodic part (the server's scheduler runs it every few seconds): purge old rows and
    queue repeat reminders for unresolved heavy incidents; returns the reminders queued (the
    outbox dispatcher sends them, and re-sends rows whose task was lost or whose retry is due)."""
    config = current_config()
    if not config.channels:
        return 0
    now = now or utcnow()
    with Session(engine) as session:
        purge_old_deliveries(session, before=now - timedelta(days=config.retention_days))
        reminders = queue_reminders(
            session, config=config, now=now, is_open=_incident_is_open(session)
        )
        session.commit()
    return len(reminders)
