from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.alerts.errors import AlertEventError
from app.alerts.events import EventKind, reminder_event, reminders_due
from app.policy.signals import Tier
from tests.unit.app.alerts._factories import T0, event


def test_strings_are_turned_into_enums() -> None:
    e = event(kind="escalated", tier="heavy")
    assert e.kind is EventKind.ESCALATED and e.tier is Tier.HEAVY


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tier": "severe"}, "tier='severe' is not one of: light, medium, heavy"),
        ({"kind": "exploded"}, "kind='exploded'"),
        ({"occurred_at": datetime(2026, 1, 1)}, "occurred_at=2026-01-01T00:00:00 has no time zone"),
        ({"occurred_at": "2026-01-01"}, "occurred_at='2026-01-01' is not a datetime"),
        ({"incident_id": 0}, "incident_id=0 must be a positive integer"),
        ({"incident_id": True}, "incident_id=True"),
        ({"event_id": ""}, "event_id=''"),
        ({"fault_kind": ""}, "fault_kind=''"),
        ({"job": 5}, "job=5 is not a string"),
        ({"actions_taken": ("ok", 3)}, "actions_taken[1]=3"),
        ({"approval_id": -2}, "approval_id=-2"),
        ({"kind": "approval_decided"}, "decision is required when kind='approval_decided'"),
        ({"kind": "approval_requested"}, "approval_id is required when kind='approval_requested'"),
        ({"kind": "approval_decided", "decision": "maybe"}, "decision='maybe'"),
    ],
)
def test_bad_fields_are_refused_with_their_name(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(AlertEventError) as err:
        event(**overrides)
    assert message in str(err.value)


def test_long_ingested_text_is_bounded() -> None:
    e = event(
        job="j" * 5000,
        evidence_summary="x" * 50_000,
        actions_taken=tuple(f"a{i}" for i in range(100)),
    )
    assert len(e.job or "") == 200 and (e.job or "").endswith("…")
    assert len(e.evidence_summary) == 2000
    assert len(e.actions_taken) == 20


def test_reminders_are_due_once_per_interval_and_never_in_bursts() -> None:
    interval = timedelta(minutes=30)
    assert (
        reminders_due(
            opened_at=T0, now=T0 + timedelta(minutes=29), repeat_interval=interval, already_sent=0
        )
        == []
    )
    assert reminders_due(
        opened_at=T0, now=T0 + timedelta(minutes=30), repeat_interval=interval, already_sent=0
    ) == [1]
    assert (
        reminders_due(
            opened_at=T0, now=T0 + timedelta(minutes=45), repeat_interval=interval, already_sent=1
        )
        == []
    )
    # A scheduler that was down for three hours sends the latest reminder only.
    assert reminders_due(
        opened_at=T0,
        now=T0 + timedelta(hours=3, minutes=1),
        repeat_interval=interval,
        already_sent=1,
    ) == [6]


def test_reminder_events_have_stable_ids() -> None:
    template = event(tier="heavy", approval_id=7, kind="approval_requested")
    at = T0 + timedelta(minutes=30)
    first = reminder_event(incident_id=42, number=1, template=template, occurred_at=at)
    again = reminder_event(
        incident_id=42, number=1, template=template, occurred_at=at + timedelta(seconds=5)
    )
    assert first.event_id == again.event_id == "reminder-1"
    assert first.kind is EventKind.REMINDER and first.tier is Tier.HEAVY and first.approval_id == 7


def test_reminders_due_rejects_bad_arguments() -> None:
    with pytest.raises(AlertEventError, match="repeat_interval"):
        reminders_due(opened_at=T0, now=T0, repeat_interval=timedelta(0), already_sent=0)
    with pytest.raises(AlertEventError, match="no time zone"):
        reminders_due(
            opened_at=datetime(2026, 1, 1),
            now=datetime.now(UTC),
            repeat_interval=timedelta(minutes=1),
            already_sent=0,
        )
