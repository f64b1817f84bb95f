"""The alert path's stages: from a timeline entry worth a message to a sent delivery.

In order, as Alertmanager's notification pipeline runs them:

1. inhibit, 2. silence, 3. maintenance window (``MUTE_STAGES``): asked when the alert inbox
   (``app.incidents.alert_inbox``) flushes an incident's waiting entries, at every flush, so an
   alert whose silence ended simply goes out at the next one. The first verdict wins.
4. rate limit: per channel, by the worker that sends (``app.alerts.ratelimit``).
5. group: the rows of one incident and channel due together go as one message, when a worker
   claims them (``app.alerts.queue.claim``, ``app.alerts.grouping``).

``queue_entries`` builds the deliveries of entries no stage muted, in the caller's transaction;
the outbox dispatcher hands them to Celery after the commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlmodel import Session

from app.alerts.events import AlertEvent, Decision, EventKind
from app.alerts.queue import actions_taken, queue_events
from app.alerts.service import current_config
from app.core.db import begin_savepoint
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from app.policy.signals import Tier
from app.silences.muting import Mute, inhibition, maintenance, silencing

log = logging.getLogger("rlguard.alerts.pipeline")

MuteStage = Callable[[Session, Incident, datetime], Mute | None]
MUTE_STAGES: tuple[MuteStage, ...] = (inhibition, silencing, maintenance)

# Timeline entries (IncidentEvent.type) that are worth a message, and what they become.
_TIMELINE: dict[str, tuple[EventKind, Decision | None]] = {
    IncidentEventType.OPENED: (EventKind.OPENED, None),
    # Alertmanager's rule: an alert still firing when its mute ends is sent then.
    IncidentEventType.UNMUTED: (EventKind.OPENED, None),
    IncidentEventType.ESCALATED: (EventKind.ESCALATED, None),
    IncidentEventType.APPROVAL_REQUESTED: (EventKind.APPROVAL_REQUESTED, None),
    IncidentEventType.APPROVAL_GRANTED: (EventKind.APPROVAL_DECIDED, Decision.APPROVED),
    IncidentEventType.APPROVAL_REJECTED: (EventKind.APPROVAL_DECIDED, Decision.REJECTED),
    IncidentEventType.APPROVAL_EXPIRED: (EventKind.APPROVAL_DECIDED, Decision.EXPIRED),
    IncidentEventType.ACTION_FAILED: (EventKind.ACTION_FAILED, None),
    IncidentEventType.RESOLVED: (EventKind.RESOLVED, None),
}

# The entries the alert path looks at: the timeline marks them pending when it appends them.
ALERTED_EVENT_TYPES = frozenset(IncidentEventType(t) for t in _TIMELINE)


def first_mute(session: Session, incident: Incident, now: datetime) -> Mute | None:
    """The first of the mute stages that mutes ``incident``'s alert at ``now``, if any."""
    for stage in MUTE_STAGES:
        mute = stage(session, incident, now)
        if mute is not None:
            return mute
    return None


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


def queue_entries(session: Session, entries: Sequence[IncidentEvent], *, now: datetime) -> int:
    """Queue the deliveries of ``entries`` (flushed rows no stage muted), in the caller's
    transaction; returns the rows queued.

    Alerting must never block the incident writer: a failure is logged, nothing of it is kept
    and the caller goes on (those entries are not alerted).
    """
    try:
        config = current_config()
    except Exception:
        log.exception(
            "alerts configuration unusable; %d timeline entries not alerted", len(entries)
        )
        return 0
    if not config.channels or not entries:
        return 0
    queued = 0
    for row in entries:
        # One savepoint per entry: a failure rolls back only that entry's rows.
        try:
            with begin_savepoint(session):
                event = alert_event_for(session, row)
                if event is not None:
                    queued += len(queue_events(session, events=[event], config=config, now=now))
        except Exception:
            log.exception(
                "alerts for incident %s (%s) not queued; the incident goes on",
                row.incident_id,
                row.type,
            )
    return queued
