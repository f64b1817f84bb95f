"""The alert delivery queue in the database: queue events per channel, claim what is due,
record the outcome.

`queue_events` runs inside the caller's transaction (an incident event and its deliveries
commit together); after the commit the outbox dispatcher (`app.actions.outbox`, the same one
that sends recovery actions) hands the new rows to Celery, one task per row
(`app.tasks.alert_tasks`), which calls `claim` → sends → `record_result`.

Every state change is a compare-and-set UPDATE on the row's current state, so two workers (or
a task delivered twice) can never both send the same message, on SQLite as on PostgreSQL, with
no lock held while the HTTP call runs. A claim carries a lease: a worker killed mid-send leaves
a row that the sweeper (`due_for_dispatch`) hands out again once the lease ran out.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult
from sqlmodel import Session, col, select

from app.alerts.config import AlertsConfig
from app.alerts.delivery import DeliveryRecord, DeliveryStatus
from app.alerts.errors import AlertConfigError, AlertEventError
from app.alerts.events import (
    AlertEvent,
    EventKind,
    event_from_json,
    event_to_json,
    reminder_event,
    reminders_due,
)
from app.alerts.grouping import AlertBatch, dedupe_key, group_events
from app.core.db import dialect_insert, table_of
from app.models.action import ActionStatus, RecoveryAction
from app.models.alert import OPEN_STATES, AlertDelivery, DeliveryState
from app.models.incident import Incident
from app.policy.signals import Tier

log = logging.getLogger("rlguard.alerts.queue")

MAX_ATTEMPT_LOG = 50
DELIVER_TASK = "alerts.deliver"
# Session.info key: rows this session queued, so its owner knows to wake the dispatcher.
_QUEUED_KEY = "rlguard.alert_rows_queued"
_REMINDER_ID = re.compile(r"^reminder-(\d+)$")


@dataclass(frozen=True, slots=True)
class TaskRetryPolicy:
    """Retries across task runs, after the delivery client's own quick retries gave up."""

    max_task_runs: int = 4
    base_delay: timedelta = timedelta(minutes=1)
    max_delay: timedelta = timedelta(minutes=15)
    # A claimed row whose worker vanished (kill -9, OOM) may be re-claimed after this.
    lease: timedelta = timedelta(minutes=6)

    @classmethod
    def from_config(cls, config: AlertsConfig) -> TaskRetryPolicy:
        base = timedelta(seconds=config.retry_base_delay_s)
        return cls(
            max_task_runs=config.max_task_runs,
            base_delay=base,
            max_delay=max(base, timedelta(minutes=15)),
            lease=timedelta(seconds=config.claim_lease_s),
        )

    def delay(self, task_runs: int) -> timedelta:
        grown: timedelta = self.base_delay * 2 ** max(0, task_runs - 1)
        return min(self.max_delay, grown)


@dataclass(frozen=True, slots=True)
class SendPlan:
    lead_id: int
    channel: str
    batch: AlertBatch
    start_part: int


@dataclass(frozen=True, slots=True)
class Wait:
    until: datetime


def _insert(session: Session) -> Any:
    return dialect_insert(session.get_bind().dialect.name, table_of(AlertDelivery))


def queue_events(
    session: Session, *, events: Sequence[AlertEvent], config: AlertsConfig, now: datetime
) -> list[int]:
    """Add a pending delivery per (event, channel that accepts it); returns the new row ids.

    An event already queued for a channel (same dedupe key) is skipped: the unique constraint
    decides, so a repeat after a restart or a race between two callers queues nothing twice.
    The caller commits, then wakes the outbox dispatcher, which passes them to `dispatch`.
    """
    ids: list[int] = []
    for event in events:
        document = event_to_json(event)
        for channel in config.channels:
            if not channel.accepts(event):
                continue
            values = {
                "dedupe_key": dedupe_key(
                    incident_id=event.incident_id, event_id=event.event_id, channel=channel.name
                ),
                "incident_id": event.incident_id,
                "event_id": event.event_id,
                "event_kind": event.kind.value,
                "tier": event.tier.value,
                "channel": channel.name,
                "channel_type": channel.type,
                "event": document,
                "occurred_at": event.occurred_at,
                "due_at": event.occurred_at + config.group_wait,
                "state": DeliveryState.PENDING.value,
                "attempts": 0,
                "task_runs": 0,
                "parts_total": 0,
                "parts_sent": 0,
                "attempt_log": [],
                "created_at": now,
                "updated_at": now,
            }
            stmt = (
                _insert(session)
                .values(**values)
                .on_conflict_do_nothing(index_elements=["dedupe_key"])
                .returning(table_of(AlertDelivery).c.id)
            )
            new_id = session.execute(stmt).scalar_one_or_none()
            if new_id is None:
                log.info("alert event already queued: %s", values["dedupe_key"])
            else:
                ids.append(int(new_id))
    if ids:
        session.info[_QUEUED_KEY] = True
    return ids


def took_queued_rows(session: Session) -> bool:
    """Whether `queue_events` added rows in this session since the last call (then: wake the
    dispatcher after the commit)."""
    return bool(session.info.pop(_QUEUED_KEY, False))


def undispatched(session: Session) -> list[int]:
    """Pending rows never handed to the broker: `dispatch` stamps `updated_at`, and nothing
    else touches a pending row, so theirs is still their `created_at`."""
    d = AlertDelivery
    rows = session.exec(
        select(d.id).where(
            col(d.state) == DeliveryState.PENDING.value, col(d.updated_at) == col(d.created_at)
        )
    ).all()
    return sorted(int(i) for i in rows if i is not None)


def dispatch(
    session: Session,
    *,
    ids: Sequence[int],
    enqueue: Callable[[int, datetime], None],
    now: datetime | None = None,
) -> int:
    """Hand committed rows to the queue (`enqueue(id, eta)`); returns how many went.

    A broker that is down must not block the caller: the first failure is logged, the rest is
    left for the next sweep (`due_for_dispatch`). With `now`, each row sent is stamped so the
    sweeper does not send it again for a while, and `undispatched` no longer lists it; the
    caller commits.
    """
    sent = 0
    table = table_of(AlertDelivery)
    for delivery_id in ids:
        row = session.get(AlertDelivery, delivery_id)
        if row is None:
            continue
        eta = row.next_attempt_at if row.state == DeliveryState.RETRYING.value else row.due_at
        try:
            enqueue(delivery_id, eta or row.due_at)
        except Exception as exc:  # kombu/redis raise many types; all mean "not sent now"
            log.warning(
                "alert delivery %d not enqueued (%s: %s); %d row(s) wait for the next sweep",
                delivery_id,
                type(exc).__name__,
                exc,
                len(ids) - sent,
            )
            break
        sent += 1
        if now is not None:
            # Never the row's own creation time, which would make it look never sent.
            stamp = max(now, row.created_at + timedelta(microseconds=1))
            session.execute(
                sa.update(table).where(table.c.id == delivery_id).values(updated_at=stamp)
            )
    return sent


def _cas(
    session: Session, delivery_id: int, expect: Sequence[str], now: datetime, **values: Any
) -> bool:
    table = table_of(AlertDelivery)
    stmt = (
        sa.update(table)
        .where(table.c.id == delivery_id, table.c.state.in_(list(expect)))
        .values(updated_at=now, **values)
    )
    result = cast(CursorResult[Any], session.execute(stmt))
    return result.rowcount == 1


def _event(row: AlertDelivery) -> AlertEvent:
    return event_from_json(row.event)


def _suppress_if_unwanted(
    session: Session, row: AlertDelivery, config: AlertsConfig, now: datetime
) -> bool:
    try:
        channel = config.channel(row.channel)
    except AlertConfigError:
        reason = f"channel {row.channel!r} is no longer configured"
    else:
        if channel.type != row.channel_type:
            reason = f"channel {row.channel!r} changed type to {channel.type}"
        elif channel.muted:
            reason = f"channel {row.channel!r} is muted"
        else:
            return False
    _cas(
        session,
        row.id or 0,
        OPEN_STATES,
        now,
        state=DeliveryState.SUPPRESSED.value,
        last_error=reason,
    )
    return True


def claim(
    session: Session,
    *,
    delivery_id: int,
    config: AlertsConfig,
    now: datetime,
    retry: TaskRetryPolicy = TaskRetryPolicy(),
) -> SendPlan | Wait | None:
    """Decide what the task for `delivery_id` does now: send a batch, wait, or nothing.

    Commits its claim, so the send that follows happens outside any transaction.
    """
    row = session.get(AlertDelivery, delivery_id)
    if row is None:
        raise AlertEventError(f"alert delivery {delivery_id} does not exist")
    session.refresh(row)
    state = DeliveryState(row.state)
    if state not in OPEN_STATES:
        return None
    if _suppress_if_unwanted(session, row, config, now):
        session.commit()
        return None
    lease_until = now + retry.lease
    if state in (DeliveryState.RETRYING, DeliveryState.SENDING):
        return _claim_resend(session, row, state, now, lease_until)
    return _claim_pending(session, row, config, now, lease_until)


def _claim_resend(
    session: Session, row: AlertDelivery, state: DeliveryState, now: datetime, until: datetime
) -> SendPlan | Wait | None:
    """A retry that is due, or a claim whose worker vanished: send the same batch again."""
    delivery_id = row.id or 0
    if row.next_attempt_at is not None and row.next_attempt_at > now:
        # Retry not due yet, or another worker holds a live claim on it.
        return Wait(row.next_attempt_at) if state is DeliveryState.RETRYING else None
    if not _cas(
        session,
        delivery_id,
        [state.value],
        now,
        state=DeliveryState.SENDING.value,
        next_attempt_at=until,
        task_runs=row.task_runs + 1,
    ):
        session.rollback()
        return None
    grouped = session.exec(
        select(AlertDelivery)
        .where(AlertDelivery.batch_id == delivery_id)
        .order_by(AlertDelivery.id)  # type: ignore[arg-type]
    ).all()
    session.commit()
    batch = AlertBatch(tuple([_event(row), *(_event(g) for g in grouped)]))
    return SendPlan(
        delivery_id, row.channel, current_view(session, batch), start_part=row.parts_sent
    )


def _claim_pending(
    session: Session, row: AlertDelivery, config: AlertsConfig, now: datetime, until: datetime
) -> SendPlan | Wait | None:
    """A pending row: send its group once the group window closed, grouping the rest in."""
    pending = session.exec(
        select(AlertDelivery).where(
            AlertDelivery.incident_id == row.incident_id,
            AlertDelivery.channel == row.channel,
            AlertDelivery.state == DeliveryState.PENDING.value,
        )
    ).all()
    rows_by_event = {p.event_id: p for p in pending}
    result = group_events([_event(p) for p in pending], now=now, group_wait=config.group_wait)
    batch = next((b for b in result.ready if row.event_id in {e.event_id for e in b.events}), None)
    if batch is None:
        if row.event_id not in {e.event_id for e in result.waiting}:
            return None  # claimed or grouped by another worker since we read it
        return Wait(result.next_due or row.due_at)
    lead = rows_by_event[batch.lead.event_id]
    if not _cas(
        session,
        lead.id or 0,
        [DeliveryState.PENDING.value],
        now,
        state=DeliveryState.SENDING.value,
        next_attempt_at=until,
        task_runs=lead.task_runs + 1,
    ):
        session.rollback()  # another worker claimed this batch first
        return None
    carried = [
        _event(member)
        for member in (rows_by_event[e.event_id] for e in batch.events[1:])
        if _cas(
            session,
            member.id or 0,
            [DeliveryState.PENDING.value],
            now,
            state=DeliveryState.GROUPED.value,
            batch_id=lead.id,
        )
    ]
    session.commit()
    fresh = current_view(session, AlertBatch((batch.lead, *carried)))
    return SendPlan(lead.id or 0, lead.channel, fresh, start_part=0)


def record_result(
    session: Session,
    *,
    lead_id: int,
    record: DeliveryRecord,
    now: datetime,
    retry: TaskRetryPolicy = TaskRetryPolicy(),
) -> AlertDelivery:
    """Store one send's outcome on the lead row; schedule a later try for a transient failure."""
    row = session.get(AlertDelivery, lead_id)
    if row is None:
        raise AlertEventError(f"alert delivery {lead_id} does not exist")
    session.refresh(row)
    log_entries = list(row.attempt_log) + [
        {
            "n": row.attempts + a.number,
            "part": a.part,
            "at": a.at.isoformat(),
            "response_code": a.response_code,
            "error": a.error,
            "wait_before_s": a.wait_before_s,
        }
        for a in record.attempt_log
    ]
    values: dict[str, Any] = {
        "attempts": row.attempts + record.attempts,
        "parts_total": record.parts_total,
        "parts_sent": record.parts_sent,
        "response_code": record.response_code,
        "last_error": (record.last_error or None) and record.last_error[:500],
        "attempt_log": log_entries[-MAX_ATTEMPT_LOG:],
        "next_attempt_at": None,
    }
    if record.status is DeliveryStatus.SENT:
        values.update(state=DeliveryState.SENT.value, sent_at=now)
    elif record.status is DeliveryStatus.REJECTED:
        values.update(state=DeliveryState.REJECTED.value)
    elif row.task_runs < retry.max_task_runs:
        # Never sooner than the channel asked (a Slack Retry-After may exceed our backoff).
        asked = timedelta(seconds=record.retry_after_s or 0.0)
        values.update(
            state=DeliveryState.RETRYING.value,
            next_attempt_at=now + max(retry.delay(row.task_runs), asked),
        )
    else:
        values.update(state=DeliveryState.FAILED.value)
    _cas(session, lead_id, [DeliveryState.SENDING.value], now, **values)
    session.commit()
    session.refresh(row)
    if row.state != DeliveryState.SENT.value:
        log.warning(
            "alert delivery %d on %s is %s after %d attempts: %s",
            lead_id,
            row.channel,
            row.state,
            row.attempts,
            row.last_error,
        )
    return row


def due_for_dispatch(
    session: Session, *, now: datetime, grace: timedelta
) -> list[tuple[int, datetime]]:
    """Rows a sweeper should (re)enqueue: pending past their window by `grace` (their task was
    lost, e.g. the broker was down), retries that are due, and claims whose lease expired."""
    d = AlertDelivery
    rows = session.exec(
        select(d)
        .where(
            sa.or_(
                sa.and_(col(d.state) == DeliveryState.PENDING.value, col(d.due_at) <= now - grace),
                sa.and_(
                    col(d.state).in_([DeliveryState.RETRYING.value, DeliveryState.SENDING.value]),
                    col(d.next_attempt_at) <= now,
                ),
            ),
            # Not sent (or touched by a worker) within the grace period: a row that was just
            # enqueued is left alone, so a stopped worker does not pile up copies in the queue.
            col(d.updated_at) <= now - grace,
        )
        .order_by(col(d.id))
    ).all()
    return [(r.id or 0, now) for r in rows]


def queue_reminders(
    session: Session,
    *,
    config: AlertsConfig,
    now: datetime,
    is_open: Callable[[int], bool] | None = None,
) -> list[int]:
    """Queue the due repeat reminder of every unresolved heavy incident; returns new row ids.

    An incident counts as unresolved when no "resolved" event was queued for it and, if given,
    `is_open(incident_id)` agrees. Reminder n has event id `reminder-n`, so a reminder computed
    twice (two schedulers, a restart) is queued once.
    """
    d = AlertDelivery
    heavy = session.exec(select(d.incident_id).where(d.tier == Tier.HEAVY.value).distinct()).all()
    ids: list[int] = []
    for incident_id in heavy:
        rows = session.exec(
            select(d).where(d.incident_id == incident_id).order_by(col(d.occurred_at), col(d.id))
        ).all()
        if any(r.event_kind == EventKind.RESOLVED.value for r in rows):
            continue
        if is_open is not None and not is_open(int(incident_id)):
            continue
        events = [_event(r) for r in rows]
        template = events[-1]
        opened_at = template.incident_opened_at or events[0].occurred_at
        sent = [int(m.group(1)) for r in rows if (m := _REMINDER_ID.fullmatch(r.event_id))]
        for number in reminders_due(
            opened_at=opened_at,
            now=now,
            repeat_interval=config.repeat_interval,
            already_sent=max(sent, default=0),
        ):
            reminder = reminder_event(
                incident_id=int(incident_id), number=number, template=template, occurred_at=now
            )
            ids += queue_events(session, events=[reminder], config=config, now=now)
    return ids


def actions_taken(session: Session, incident_id: int) -> tuple[str, ...]:
    rows = session.exec(
        select(RecoveryAction)
        .where(RecoveryAction.incident_id == incident_id)
        .order_by(RecoveryAction.id)  # type: ignore[arg-type]
    ).all()
    return tuple(
        f"{r.action} ({r.status.replace('_', ' ')})"
        for r in rows
        if r.status != ActionStatus.cancelled.value
    )


def current_view(session: Session, batch: AlertBatch) -> AlertBatch:
    """The batch with its newest event showing the incident as it is now (actions planned when
    it opened may have run by the time the group window closes)."""
    incident = session.get(Incident, batch.incident_id)
    if incident is None:
        return batch
    latest = replace(
        batch.latest,
        actions_taken=actions_taken(session, batch.incident_id),
        evidence_summary=incident.summary or batch.latest.evidence_summary,
    )
    return AlertBatch((*batch.events[:-1], latest))


def purge_old_deliveries(session: Session, *, before: datetime) -> int:
    """Delete finished rows last touched before `before`; the caller commits."""
    table = table_of(AlertDelivery)
    final = [s.value for s in DeliveryState if s not in OPEN_STATES]
    # Grouped rows point at their lead: delete them first, then the leads.
    total = 0
    for grouped in (True, False):
        stmt = sa.delete(table).where(
            table.c.state.in_(final),
            table.c.updated_at < before,
            table.c.batch_id.is_not(None) if grouped else table.c.batch_id.is_(None),
        )
        if not grouped:
            referenced = (
                sa.select(table.c.batch_id).where(table.c.batch_id.is_not(None)).scalar_subquery()
            )
            stmt = stmt.where(table.c.id.not_in(referenced))
        total += cast(CursorResult[Any], session.execute(stmt)).rowcount or 0
    return total
