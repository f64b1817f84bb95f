"""Grouping and deduplication: which events go out together, and when.

Pure functions of (events, now): the caller (the Celery task, or a test) owns the clock and the
storage. The events of one incident that happen within `group_wait` of the first pending one go
out as one message, so a fault that trips three detectors in five seconds buzzes a phone once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.alerts.errors import AlertEventError
from app.alerts.events import AlertEvent, Decision, EventKind
from app.policy.signals import Tier


def dedupe_key(*, incident_id: int, event_id: str, channel: str) -> str:
    """The unique key of one event on one channel: the same event is never sent twice there."""
    return f"incident:{incident_id}/event:{event_id}/channel:{channel}"


@dataclass(frozen=True, slots=True)
class AlertBatch:
    """Events of one incident that go out as one message, oldest first."""

    events: tuple[AlertEvent, ...]

    def __post_init__(self) -> None:
        if not self.events:
            raise AlertEventError("an AlertBatch needs at least one event")
        incidents = {e.incident_id for e in self.events}
        if len(incidents) != 1:
            raise AlertEventError(f"an AlertBatch holds one incident, got {sorted(incidents)}")
        object.__setattr__(self, "events", tuple(sorted(self.events, key=lambda e: e.occurred_at)))

    @property
    def incident_id(self) -> int:
        return self.events[0].incident_id

    @property
    def latest(self) -> AlertEvent:
        return self.events[-1]

    @property
    def lead(self) -> AlertEvent:
        return self.events[0]

    @property
    def tier(self) -> Tier:
        # Incidents only escalate, so the highest tier seen is the incident's current tier.
        return max(e.tier for e in self.events)

    @property
    def kinds(self) -> tuple[EventKind, ...]:
        seen: list[EventKind] = []
        for event in self.events:
            if event.kind not in seen:
                seen.append(event.kind)
        return tuple(seen)

    @property
    def actions_taken(self) -> tuple[str, ...]:
        seen: list[str] = []
        for event in self.events:
            for action in event.actions_taken:
                if action not in seen:
                    seen.append(action)
        return tuple(seen)

    @property
    def approval_id(self) -> int | None:
        for event in reversed(self.events):
            if event.approval_id is not None:
                return event.approval_id
        return None

    @property
    def decision_event(self) -> AlertEvent | None:
        for event in reversed(self.events):
            if event.kind is EventKind.APPROVAL_DECIDED:
                return event
        return None

    @property
    def approval_pending(self) -> bool:
        """An approval was asked for and this batch does not already carry its decision."""
        if self.approval_id is None or EventKind.RESOLVED in self.kinds:
            return False
        decided = self.decision_event
        return decided is None or decided.decision is None

    @property
    def decision(self) -> Decision | None:
        decided = self.decision_event
        return decided.decision if decided else None

    @property
    def failed_event(self) -> AlertEvent | None:
        for event in reversed(self.events):
            if event.kind is EventKind.ACTION_FAILED:
                return event
        return None

    @property
    def needs_attention(self) -> bool:
        return any(e.needs_attention for e in self.events) and EventKind.RESOLVED not in self.kinds

    def dedupe_key(self, channel: str) -> str:
        """The batch is keyed by its first event; later events it carries are recorded as covered."""
        return dedupe_key(
            incident_id=self.incident_id, event_id=self.lead.event_id, channel=channel
        )

    def covered_keys(self, channel: str) -> tuple[str, ...]:
        return tuple(
            dedupe_key(incident_id=self.incident_id, event_id=e.event_id, channel=channel)
            for e in self.events
        )


@dataclass(frozen=True, slots=True)
class GroupingResult:
    ready: tuple[AlertBatch, ...]
    waiting: tuple[AlertEvent, ...]
    next_due: datetime | None


def group_events(
    events: Iterable[AlertEvent], *, now: datetime, group_wait: timedelta
) -> GroupingResult:
    """Split pending events into batches ready to send at `now` and events still waiting.

    Per incident, a batch starts at its oldest pending event t0 and takes every pending event of
    that incident that happened before t0 + group_wait; it is ready once now ≥ t0 + group_wait.
    Events after that window start the next batch. A duplicate event id is kept once.
    """
    if group_wait < timedelta(0):
        raise AlertEventError(f"group_wait={group_wait} must not be negative")
    by_incident: dict[int, dict[str, AlertEvent]] = {}
    for event in events:
        by_incident.setdefault(event.incident_id, {}).setdefault(event.event_id, event)
    ready: list[AlertBatch] = []
    waiting: list[AlertEvent] = []
    next_due: datetime | None = None
    for incident_id in sorted(by_incident):
        pending = sorted(by_incident[incident_id].values(), key=lambda e: e.occurred_at)
        while pending:
            window_end = pending[0].occurred_at + group_wait
            batch = [e for e in pending if e.occurred_at < window_end or e is pending[0]]
            pending = pending[len(batch) :]
            if now >= window_end:
                ready.append(AlertBatch(tuple(batch)))
            else:
                waiting.extend(batch)
                waiting.extend(pending)
                next_due = window_end if next_due is None else min(next_due, window_end)
                break
    return GroupingResult(ready=tuple(ready), waiting=tuple(waiting), next_due=next_due)


@dataclass
class AlertGrouper:
    """In-memory holder of pending events around `group_events` (one per channel or process)."""

    group_wait: timedelta
    _pending: list[AlertEvent] = field(default_factory=list)
    _sent_event_ids: set[tuple[int, str]] = field(default_factory=set)

    def add(self, event: AlertEvent) -> bool:
        """Queue `event`; False if the same event was already queued or sent."""
        key = (event.incident_id, event.event_id)
        if key in self._sent_event_ids or any(
            (e.incident_id, e.event_id) == key for e in self._pending
        ):
            return False
        self._pending.append(event)
        return True

    def flush(self, now: datetime) -> Sequence[AlertBatch]:
        """Batches due at `now`; they leave the grouper and are remembered as sent."""
        result = group_events(self._pending, now=now, group_wait=self.group_wait)
        self._pending = list(result.waiting)
        for batch in result.ready:
            self._sent_event_ids.update((e.incident_id, e.event_id) for e in batch.events)
        return result.ready

    def next_due(self, now: datetime) -> datetime | None:
        return group_events(self._pending, now=now, group_wait=self.group_wait).next_due
