"""The timeline's entries waiting for the alert path, and the record of what it decided.

The timeline marks an entry worth a message ``pending`` when it appends it
(``app.incidents.timeline``). ``flush_alerts`` takes an incident's waiting entries, asks the
alert pipeline's mute stages once for the incident (``app.alerts.pipeline``), and then:

- muted: the entries wait (``muted``) and the timeline says why, once per cause; a muted entry
  of an incident that is no longer open is dropped (its alert never went out; Alertmanager
  forgets a resolved alert that was silenced alike);
- not muted: their deliveries are queued in this transaction; if the incident is open and some
  were muted before, one ``unmuted`` entry is appended and alerted like an opening.

The incident writer flushes its incident before it plans (so the timeline reads opening, why
its alert is muted, then its plan) and once more when it is done; each outbox dispatcher pass
flushes what other processes appended; the scheduler's ``alerts`` job asks again about the
muted entries every few seconds. Entries are claimed by compare-and-set on their state, so two
flushes never alert one entry twice.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from itertools import groupby
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.alerts.pipeline import first_mute, queue_entries
from app.core.db import begin_savepoint, table_of
from app.incidents.timeline import add_event
from app.models.incident import (
    AlertState,
    Incident,
    IncidentEvent,
    IncidentEventType,
    IncidentStatus,
)
from app.silences.muting import Mute

log = logging.getLogger("rlguard.incidents.alert_inbox")
_WAITING = (AlertState.PENDING.value, AlertState.MUTED.value)


def flush_alerts(
    session: Session,
    *,
    now: datetime,
    incident_ids: Collection[int] | None = None,
    ask_muted: bool = True,
) -> int:
    """Decide the waiting entries (of ``incident_ids``, or of every incident); the caller
    commits. Returns the deliveries queued. ``ask_muted=False``: only the entries nobody asked
    about yet (the dispatcher's passes, which an incident storm wakes many times a second)."""
    session.flush()  # the caller's own appended entries are waiting too
    states = _WAITING if ask_muted else (AlertState.PENDING.value,)
    query = select(IncidentEvent).where(col(IncidentEvent.alert_state).in_(states))
    if incident_ids is not None:
        if not incident_ids:
            return 0
        query = query.where(col(IncidentEvent.incident_id).in_(list(incident_ids)))
    waiting = session.exec(query.order_by(col(IncidentEvent.incident_id), col(IncidentEvent.id)))
    queued = 0
    for incident_id, entries in groupby(waiting.all(), key=lambda e: e.incident_id):
        # Alerting never blocks the writer or the dispatcher: an incident whose flush fails
        # keeps its entries waiting, for the next flush.
        try:
            with begin_savepoint(session):
                queued += _flush_incident(session, incident_id, list(entries), now)
        except Exception:
            log.exception("alert inbox: incident %s not flushed; asked again later", incident_id)
    return queued


def ask_muted_again(engine: Engine, *, now: datetime) -> int:
    """The periodic flush (the scheduler's ``alerts`` job, every few seconds, as Alertmanager's
    group interval): every waiting entry, the muted ones asked again. Returns the deliveries
    queued (then: wake the dispatcher)."""
    with Session(engine) as session:
        queued = flush_alerts(session, now=now)
        session.commit()
    return queued


def _flush_incident(
    session: Session, incident_id: int, entries: list[IncidentEvent], now: datetime
) -> int:
    incident = session.get(Incident, incident_id)
    pending = [e for e in entries if e.alert_state == AlertState.PENDING.value]
    muted = [e for e in entries if e.alert_state == AlertState.MUTED.value]
    if incident is None:
        _claim(session, pending + muted, AlertState.DONE)
        return 0
    is_open = incident.status == IncidentStatus.open.value
    mute = first_mute(session, incident, now)
    if mute is not None:
        # Muted entries of a closed incident are dropped; an open one's wait for the next flush.
        if _claim(session, pending, AlertState.MUTED if is_open else AlertState.DONE):
            _record_once(session, incident, mute, now)
        if not is_open:
            _claim(session, muted, AlertState.DONE)
        return 0
    released = _claim(session, muted, AlertState.DONE)
    alerted = _claim(session, pending, AlertState.DONE)
    send = [e for e in pending if e.id in alerted]
    if released and is_open:
        unmuted = add_event(
            session,
            incident_id=incident.id,
            type_=IncidentEventType.UNMUTED,
            at=now,
            detail={"text": "nothing mutes its alert any more and it is still open: alerted now"},
        )
        session.flush()
        _claim(session, [unmuted], AlertState.DONE)
        send.append(unmuted)
    return queue_entries(session, send, now=now)


def _claim(session: Session, entries: Sequence[IncidentEvent], to: AlertState) -> set[int]:
    """Move ``entries`` to ``to`` from the state they were read in; the ids this flush won
    (another flush that moved one first, committed, wins it)."""
    won: set[int] = set()
    table = table_of(IncidentEvent)
    for entry in entries:
        stmt = (
            sa.update(table)
            .where(table.c.id == entry.id, table.c.alert_state == entry.alert_state)
            .values(alert_state=to.value)
            .returning(table.c.id)
        )
        if session.execute(stmt).scalar_one_or_none() is not None:
            won.add(entry.id or 0)
    for entry in entries:
        if entry.id in won:
            session.expire(entry, ["alert_state"])
    return won


def _record_once(session: Session, incident: Incident, mute: Mute, at: datetime) -> None:
    _record(session, incident, mute, at)
    if mute.inhibitor is not None:
        # The inhibited incident becomes evidence of the node incident: its timeline names it.
        took_over = Mute(
            IncidentEventType.INHIBITS,
            f"took over incident #{incident.id} ({incident.kind} on {incident.key})",
            {"incident_id": incident.id, "kind": incident.kind, "key": incident.key},
        )
        _record(session, mute.inhibitor, took_over, at)


def _record(session: Session, incident: Incident, mute: Mute, at: datetime) -> None:
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
