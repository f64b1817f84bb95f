from __future__ import annotations

from datetime import timedelta

import pytest

from app.alerts.errors import AlertEventError
from app.alerts.events import EventKind
from app.alerts.grouping import AlertBatch, AlertGrouper, dedupe_key, group_events
from tests.unit.app.alerts._factories import T0, decided, event

WAIT = timedelta(seconds=10)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def test_three_signals_in_five_seconds_make_one_message() -> None:
    events = [
        event(event_id="a", kind="opened", occurred_at=T0),
        event(event_id="b", kind="escalated", tier="heavy", occurred_at=T0 + s(2)),
        event(
            event_id="c",
            kind="approval_requested",
            tier="heavy",
            approval_id=7,
            occurred_at=T0 + s(5),
        ),
    ]
    early = group_events(events, now=T0 + s(9), group_wait=WAIT)
    assert early.ready == () and len(early.waiting) == 3 and early.next_due == T0 + WAIT
    due = group_events(events, now=T0 + WAIT, group_wait=WAIT)
    assert len(due.ready) == 1 and due.waiting == ()
    batch = due.ready[0]
    assert [e.event_id for e in batch.events] == ["a", "b", "c"]
    assert batch.kinds == (EventKind.OPENED, EventKind.ESCALATED, EventKind.APPROVAL_REQUESTED)
    assert batch.tier.value == "heavy" and batch.approval_pending and batch.approval_id == 7


def test_an_event_after_the_window_starts_the_next_message() -> None:
    events = [
        event(event_id="a", occurred_at=T0),
        event(event_id="b", kind="resolved", occurred_at=T0 + s(10)),
    ]
    result = group_events(events, now=T0 + s(12), group_wait=WAIT)
    assert [b.lead.event_id for b in result.ready] == ["a"]
    assert [e.event_id for e in result.waiting] == ["b"] and result.next_due == T0 + s(20)


def test_incidents_are_grouped_separately_and_duplicates_dropped() -> None:
    events = [
        event(incident_id=1, event_id="a", occurred_at=T0),
        event(incident_id=2, event_id="a", occurred_at=T0 + s(1)),
        event(
            incident_id=1, event_id="a", occurred_at=T0 + s(2)
        ),  # the same event, delivered twice
    ]
    result = group_events(events, now=T0 + s(30), group_wait=WAIT)
    assert [(b.incident_id, len(b.events)) for b in result.ready] == [(1, 1), (2, 1)]


def test_zero_group_wait_sends_each_event_at_once() -> None:
    events = [event(event_id="a", occurred_at=T0), event(event_id="b", occurred_at=T0 + s(1))]
    result = group_events(events, now=T0 + s(1), group_wait=timedelta(0))
    assert [len(b.events) for b in result.ready] == [1, 1]


def test_grouper_never_sends_an_event_twice() -> None:
    grouper = AlertGrouper(group_wait=WAIT)
    assert grouper.add(event(event_id="a", occurred_at=T0))
    assert not grouper.add(event(event_id="a", occurred_at=T0))
    assert grouper.add(event(event_id="b", occurred_at=T0 + s(3)))
    assert grouper.flush(T0 + s(5)) == ()
    assert grouper.next_due(T0 + s(5)) == T0 + WAIT
    sent = grouper.flush(T0 + s(10))
    assert len(sent) == 1 and len(sent[0].events) == 2
    assert not grouper.add(event(event_id="a", occurred_at=T0 + s(20)))
    assert grouper.flush(T0 + s(60)) == ()


def test_batch_facts() -> None:
    opened = event(
        event_id="a", kind="approval_requested", tier="heavy", approval_id=7, occurred_at=T0
    )
    batch = AlertBatch((decided(at=T0 + s(4)), opened))
    assert batch.lead is opened  # sorted by time
    assert not batch.approval_pending and batch.decision is not None
    assert batch.dedupe_key("slack") == "incident:42/event:a/channel:slack"
    assert batch.covered_keys("slack") == (
        "incident:42/event:a/channel:slack",
        "incident:42/event:e3/channel:slack",
    )
    assert dedupe_key(incident_id=1, event_id="x", channel="c") == "incident:1/event:x/channel:c"
    assert not AlertBatch((event(kind="resolved"),)).needs_attention
    assert AlertBatch((event(kind="opened"),)).needs_attention


def test_bad_batches_and_windows_are_refused() -> None:
    with pytest.raises(AlertEventError, match="at least one event"):
        AlertBatch(())
    with pytest.raises(AlertEventError, match=r"one incident, got \[1, 2\]"):
        AlertBatch((event(incident_id=1), event(incident_id=2)))
    with pytest.raises(AlertEventError, match="group_wait"):
        group_events([], now=T0, group_wait=s(-1))
