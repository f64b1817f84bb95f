"""Alerts, as the rest of the server sees them.

The incident service calls `on_incident_event` for every timeline entry it adds (one call
site, in `app.incidents.timeline.add_event`); the REST routes call `list_deliveries` and
`send_test_message`. The queue itself lives in `app.alerts.queue`, the Celery task in
`app.tasks.alert_tasks`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.alerts.config import AlertsConfig
from app.alerts.delivery import AlertDeliveryClient, DeliveryRecord, RetryPolicy
from app.alerts.errors import AlertEventError
from app.alerts.events import AlertEvent, Decision, EventKind
from app.alerts.queue import (
    actions_taken,
    dispatch,
    due_for_dispatch,
    purge_old_deliveries,
    queue_events,
    queue_reminders,
)
from app.alerts.render import render_test_message
from app.models._types import utcnow
from app.models.alert import AlertDelivery, DeliveryState
from app.models.incident import Incident, IncidentEvent, IncidentEventType, IncidentStatus
from app.policy.signals import Tier

log = logging.getLogger("rlguard.alerts.service")


# Timeline entries (IncidentEvent.type) that are worth a message, and what they become.
_TIMELINE: dict[str, tuple[EventKind, Decision | None]] = {
    IncidentEventType.OPENED: (EventKind.OPENED, None),
    IncidentEventType.ESCALATED: (EventKind.ESCALATED, None),
    IncidentEventType.APPROVAL_REQUESTED: (EventKind.APPROVAL_REQUESTED, None),
    IncidentEventType.APPROVAL_GRANTED: (EventKind.APPROVAL_DECIDED, Decision.APPROVED),
    IncidentEventType.APPROVAL_REJECTED: (EventKind.APPROVAL_DECIDED, Decision.REJECTED),
    IncidentEventType.APPROVAL_EXPIRED: (EventKind.APPROVAL_DECIDED, Decision.EXPIRED),
    IncidentEventType.ACTION_FAILED: (EventKind.ACTION_FAILED, None),
    IncidentEventType.RESOLVED: (EventKind.RESOLVED, None),
}

_runtime: dict[str, Any] = {"config": None, "enqueue": None}


def configure(
    *, config: AlertsConfig | None, enqueue: Callable[[int, datetime], None] | None
) -> None:
    """Set the configuration and the queue used by `on_incident_event` (server/worker start-up,
    tests). Unset values are loaded lazily from the settings and the Celery task module."""
    _runtime["config"], _runtime["enqueue"] = config, enqueue


def current_config() -> AlertsConfig:
    if _runtime["config"] is None:
        from app.alerts.settings import load_server_alerts_config
        from app.core.config import get_settings

        settings = get_settings()
        _runtime["config"] = load_server_alerts_config(settings)
    config: AlertsConfig = _runtime["config"]
    return config


def _enqueue() -> Callable[[int, datetime], None]:
    if _runtime["enqueue"] is None:
        from app.tasks.alert_tasks import enqueue_delivery

        _runtime["enqueue"] = enqueue_delivery
    enqueue: Callable[[int, datetime], None] = _runtime["enqueue"]
    return enqueue


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
    message cost nothing. The rows are handed to Celery after the caller commits. Alerting
    must never block the policy engine: a failure here is logged and the incident goes on.
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
        with session.begin_nested():
            event = alert_event_for(session, row)
            if event is None:
                return
            ids = queue_events(session, events=[event], config=config, now=utcnow())
    except Exception:
        log.exception(
            "alerts for incident %s (%s) not queued; the incident goes on",
            row.incident_id,
            row.type,
        )
        return
    due = event.occurred_at + config.group_wait
    _after_commit(session).extend((i, due) for i in ids)


class _Publisher:
    """Hands committed rows to the broker from a daemon thread, so that a slow or dead broker
    never stalls the transaction that queued them (the policy tick, an approval request).

    The first refusal ends a batch: the broker is down, and the rows left pending are
    re-enqueued by the scheduler's maintenance job (`run_alert_maintenance`).
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[list[tuple[int, datetime]], Callable[[int, datetime], None]]
        ]
        self._jobs = queue.SimpleQueue()
        self._busy = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(
        self, rows: list[tuple[int, datetime]], enqueue: Callable[[int, datetime], None]
    ) -> None:
        with self._cond:
            self._busy += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="alert-publisher", daemon=True
                )
                self._thread.start()
        self._jobs.put((rows, enqueue))

    def wait_idle(self, timeout: float) -> bool:
        """True once everything submitted so far was handed over (or refused)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._busy == 0, timeout)

    def _run(self) -> None:
        while True:
            rows, enqueue = self._jobs.get()
            try:
                for n, (delivery_id, due) in enumerate(rows):
                    try:
                        enqueue(delivery_id, due)
                    except Exception as exc:  # kombu/redis raise many types: "not sent now"
                        log.warning(
                            "alert delivery %d not enqueued (%s: %s); %d row(s) wait for the sweeper",
                            delivery_id,
                            type(exc).__name__,
                            exc,
                            len(rows) - n,
                        )
                        break
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()


_publisher = _Publisher()


def wait_published(timeout: float = 10.0) -> bool:
    """Wait until the rows of committed transactions were handed to the broker (tests, shutdown)."""
    return _publisher.wait_idle(timeout)


def _after_commit(session: Session) -> list[tuple[int, datetime]]:
    """Per-session list of queued rows, enqueued once the session's transaction commits."""
    pending: list[tuple[int, datetime]] | None = session.info.get("rlguard_alert_rows")
    if pending is not None:
        return pending
    pending = []
    session.info["rlguard_alert_rows"] = pending

    def commit(committed: Session) -> None:
        if committed.in_nested_transaction():
            return  # a savepoint was released; the rows are not committed yet
        rows, pending[:] = list(pending), []
        if rows:
            _publisher.submit(rows, _enqueue())

    def end(_session: Any, transaction: Any) -> None:
        if transaction.parent is None:
            pending.clear()

    sa.event.listen(session, "after_commit", commit)
    sa.event.listen(session, "after_transaction_end", end)
    return pending


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


def run_alert_maintenance(
    engine: Engine,
    *,
    now: datetime | None = None,
    grace: timedelta = timedelta(seconds=60),
    enqueue: Callable[[int, datetime], None] | None = None,
) -> tuple[int, int]:
    """The periodic part (the server's scheduler runs it every few seconds): re-enqueue rows
    whose task was lost or whose retry is due, and queue repeat reminders for unresolved heavy
    incidents. Returns (rows enqueued, reminders queued)."""
    config = current_config()
    if not config.channels:
        return 0, 0
    now = now or utcnow()
    with Session(engine, expire_on_commit=False) as session:
        purge_old_deliveries(session, before=now - timedelta(days=config.retention_days))
        due = due_for_dispatch(session, now=now, grace=grace)
        reminders = queue_reminders(
            session, config=config, now=now, is_open=_incident_is_open(session)
        )
        session.commit()
        ids = [i for i, _ in due] + reminders
        sent = dispatch(session, ids=ids, enqueue=enqueue or _enqueue(), now=now)
        session.commit()
    return sent, len(reminders)
