"""The input of the alerting pipeline: one `AlertEvent` per incident timeline entry.

The policy engine (incidents, approvals) builds these; nothing here reads the database, so the
renderers, the grouping and the delivery client can be tested on their own.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from app.alerts.errors import AlertEventError
from app.policy.signals import Tier


class EventKind(enum.StrEnum):
    OPENED = "opened"
    ESCALATED = "escalated"
    APPROVAL_REQUESTED = "approval_requested"
    APPROVAL_DECIDED = "approval_decided"
    ACTION_FAILED = "action_failed"
    RESOLVED = "resolved"
    REMINDER = "reminder"


class Decision(enum.StrEnum):
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


# Events after which a person is expected to do something: these are the ones that page people
# (WeCom mentions) on the heavy tier. Announcing a decision or a resolution must not wake anyone.
ATTENTION_KINDS = frozenset(
    {
        EventKind.OPENED,
        EventKind.ESCALATED,
        EventKind.APPROVAL_REQUESTED,
        EventKind.ACTION_FAILED,
        EventKind.REMINDER,
    }
)

# Free-text fields come from ingested data (job and node names, evidence); they are bounded here
# so that no renderer has to trust their size.
MAX_NAME_CHARS = 200
MAX_TEXT_CHARS = 2000
MAX_ACTIONS = 20

E = TypeVar("E", bound=enum.Enum)


def _enum_value(enum_cls: type[E], name: str, value: object) -> E:
    try:
        return enum_cls(value)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in enum_cls)
        raise AlertEventError(f"{name}={value!r} is not one of: {allowed}") from None


def _aware(name: str, value: object) -> datetime:
    if not isinstance(value, datetime):
        raise AlertEventError(f"{name}={value!r} is not a datetime")
    if value.tzinfo is None or value.utcoffset() is None:
        raise AlertEventError(f"{name}={value.isoformat()} has no time zone (use UTC)")
    return value


def _bounded_text(name: str, value: object, limit: int, *, optional: bool) -> str | None:
    if value is None:
        if optional:
            return None
        raise AlertEventError(f"{name} is required")
    if not isinstance(value, str):
        raise AlertEventError(f"{name}={value!r} is not a string")
    return value if len(value) <= limit else value[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """One thing that happened to an incident and may be worth a message.

    `event_id` identifies the timeline entry (stable across retries and restarts): together with
    the incident and the channel it forms the dedupe key, so one event is never sent twice.
    """

    incident_id: int
    event_id: str
    kind: EventKind
    tier: Tier
    occurred_at: datetime
    fault_kind: str
    job: str | None = None
    node: str | None = None
    role: str | None = None
    evidence_summary: str = ""
    actions_taken: tuple[str, ...] = ()
    approval_id: int | None = None
    decision: Decision | None = None
    decided_by: str | None = None
    comment: str | None = None
    failed_action: str | None = None
    error: str | None = None
    incident_opened_at: datetime | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        if (
            not isinstance(self.incident_id, int)
            or isinstance(self.incident_id, bool)
            or self.incident_id < 1
        ):
            raise AlertEventError(f"incident_id={self.incident_id!r} must be a positive integer")
        if not isinstance(self.event_id, str) or not self.event_id or len(self.event_id) > 100:
            raise AlertEventError(
                f"event_id={self.event_id!r} must be a non-empty string of ≤ 100 chars"
            )
        put("kind", _enum_value(EventKind, "kind", self.kind))
        put("tier", _enum_value(Tier, "tier", self.tier))
        _aware("occurred_at", self.occurred_at)
        if self.incident_opened_at is not None:
            _aware("incident_opened_at", self.incident_opened_at)
        if not isinstance(self.fault_kind, str) or not self.fault_kind:
            raise AlertEventError(f"fault_kind={self.fault_kind!r} must be a non-empty string")
        put(
            "fault_kind",
            _bounded_text("fault_kind", self.fault_kind, MAX_NAME_CHARS, optional=False),
        )
        for name in ("job", "node", "role", "decided_by", "failed_action"):
            put(name, _bounded_text(name, getattr(self, name), MAX_NAME_CHARS, optional=True))
        for name in ("comment", "error"):
            put(name, _bounded_text(name, getattr(self, name), MAX_TEXT_CHARS, optional=True))
        put(
            "evidence_summary",
            _bounded_text(
                "evidence_summary", self.evidence_summary, MAX_TEXT_CHARS, optional=False
            ),
        )
        actions = tuple(self.actions_taken)
        for i, action in enumerate(actions):
            if not isinstance(action, str):
                raise AlertEventError(f"actions_taken[{i}]={action!r} is not a string")
        put(
            "actions_taken",
            tuple(
                _bounded_text("action", a, MAX_NAME_CHARS, optional=False)
                for a in actions[:MAX_ACTIONS]
            ),
        )
        if self.approval_id is not None and (
            not isinstance(self.approval_id, int)
            or isinstance(self.approval_id, bool)
            or self.approval_id < 1
        ):
            raise AlertEventError(f"approval_id={self.approval_id!r} must be a positive integer")
        if self.decision is not None:
            put("decision", _enum_value(Decision, "decision", self.decision))
        if self.kind is EventKind.APPROVAL_DECIDED and self.decision is None:
            raise AlertEventError("decision is required when kind='approval_decided'")
        if self.kind is EventKind.APPROVAL_REQUESTED and self.approval_id is None:
            raise AlertEventError("approval_id is required when kind='approval_requested'")

    @property
    def needs_attention(self) -> bool:
        return self.kind in ATTENTION_KINDS


def reminder_event(
    *,
    incident_id: int,
    number: int,
    template: AlertEvent,
    occurred_at: datetime,
) -> AlertEvent:
    """The `number`-th repeat reminder of an incident, built from its latest known state.

    The event id is derived from the number alone, so a reminder computed twice (for instance
    after a worker restart) has the same dedupe key and goes out once.
    """
    return AlertEvent(
        incident_id=incident_id,
        event_id=f"reminder-{number}",
        kind=EventKind.REMINDER,
        tier=template.tier,
        occurred_at=occurred_at,
        fault_kind=template.fault_kind,
        job=template.job,
        node=template.node,
        role=template.role,
        evidence_summary=template.evidence_summary,
        actions_taken=template.actions_taken,
        approval_id=template.approval_id,
        incident_opened_at=template.incident_opened_at,
    )


def reminders_due(
    *, opened_at: datetime, now: datetime, repeat_interval: timedelta, already_sent: int
) -> list[int]:
    """Reminder numbers that are due at `now` and were not sent yet (`already_sent` so far).

    Reminder n is due at `opened_at + n * repeat_interval`; only the newest missed one is
    returned, so a scheduler that was down for hours sends one reminder, not a burst.
    """
    if repeat_interval <= timedelta(0):
        raise AlertEventError(f"repeat_interval={repeat_interval} must be positive")
    _aware("opened_at", opened_at)
    _aware("now", now)
    elapsed = now - opened_at
    if elapsed < repeat_interval:
        return []
    latest = int(elapsed / repeat_interval)
    return [latest] if latest > already_sent else []


def event_to_json(event: AlertEvent) -> dict[str, object]:
    """A JSON-safe dict that `event_from_json` turns back into the same event."""
    return {
        "incident_id": event.incident_id,
        "event_id": event.event_id,
        "kind": event.kind.value,
        "tier": event.tier.value,
        "occurred_at": event.occurred_at.isoformat(),
        "fault_kind": event.fault_kind,
        "job": event.job,
        "node": event.node,
        "role": event.role,
        "evidence_summary": event.evidence_summary,
        "actions_taken": list(event.actions_taken),
        "approval_id": event.approval_id,
        "decision": event.decision.value if event.decision else None,
        "decided_by": event.decided_by,
        "comment": event.comment,
        "failed_action": event.failed_action,
        "error": event.error,
        "incident_opened_at": event.incident_opened_at.isoformat()
        if event.incident_opened_at
        else None,
        "extra": dict(event.extra),
    }


def event_from_json(data: dict[str, object]) -> AlertEvent:
    """Inverse of `event_to_json`; a bad document raises `AlertEventError` naming the field."""
    if not isinstance(data, dict):
        raise AlertEventError(f"an alert event must be a JSON object, got {type(data).__name__}")
    values = dict(data)
    for name in ("occurred_at", "incident_opened_at"):
        raw = values.get(name)
        if isinstance(raw, str):
            try:
                values[name] = datetime.fromisoformat(raw)
            except ValueError:
                raise AlertEventError(f"{name}={raw!r} is not an ISO 8601 time") from None
    actions = values.get("actions_taken") or ()
    if not isinstance(actions, list | tuple):
        raise AlertEventError(f"actions_taken={actions!r} is not a list")
    values["actions_taken"] = tuple(actions)
    try:
        return AlertEvent(**values)  # type: ignore[arg-type]
    except TypeError as exc:
        raise AlertEventError(f"bad alert event document: {exc}") from None
