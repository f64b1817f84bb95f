"""Alerts, as the rest of the server sees them: the configuration in use, the deliveries'
listing, a test message, and the periodic upkeep (reminders, purge).

Timeline entries become deliveries through the alert inbox (`app.incidents.alert_inbox`) and
the stages of `app.alerts.pipeline`; the queue lives in `app.alerts.queue`; its rows reach
Celery through the outbox dispatcher (`app.actions.outbox`), as recovery actions do, and are
sent by the task in `app.tasks.alert_tasks` (`app.alerts.sender` on the worker).
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
from app.alerts.queue import purge_old_deliveries, queue_reminders
from app.alerts.render import render_test_message
from app.models._types import utcnow
from app.models.alert import AlertDelivery, DeliveryState
from app.models.incident import Incident, IncidentStatus

log = logging.getLogger("rlguard.alerts.service")


_runtime: dict[str, Any] = {"config": None}


def configure(*, config: AlertsConfig | None) -> None:
    """Set the configuration the alert path uses (server/worker start-up, tests); unset, it is
    loaded lazily from the settings."""
    _runtime["config"] = config


def current_config() -> AlertsConfig:
    if _runtime["config"] is None:
        from app.alerts.settings import load_server_alerts_config
        from app.core.config import get_settings

        settings = get_settings()
        _runtime["config"] = load_server_alerts_config(settings)
    config: AlertsConfig = _runtime["config"]
    return config


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
