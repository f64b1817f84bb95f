"""The alert inbox (`app.incidents.alert_inbox`): a mute is asked again at every flush, a flush
that lost the race to another alerts nothing twice, and a muted alert of a closed incident is
dropped. SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.actions.outbox import OutboxDispatcher
from app.alerts import pipeline
from app.incidents import alert_inbox
from app.incidents.alert_inbox import ask_muted_again, flush_alerts
from app.incidents.persist import resolve_incident
from app.incidents.timeline import add_event
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from app.policy.signals import FaultKind, Subject
from tests.integration.silences.test_muting import (
    AT,
    actions,
    deliveries,
    open_,
    silence,
    timeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
GPU = Subject(node="n1", gpu="3")


def states(engine: Engine, incident_id: int) -> list[tuple[str, str | None]]:
    """The timeline's (type, alert_state) of the entries the alert path looks at."""
    query = select(IncidentEvent.type, IncidentEvent.alert_state).where(
        IncidentEvent.incident_id == incident_id, col(IncidentEvent.alert_state).is_not(None)
    )
    with Session(engine) as s:
        return [(t, a) for t, a in s.exec(query.order_by(col(IncidentEvent.id))).all()]


def flush(engine: Engine, at: timedelta) -> int:
    with Session(engine) as s:
        queued = flush_alerts(s, now=AT + at)
        s.commit()
        return queued


def test_a_muted_alert_waits_and_is_asked_again_at_every_flush(engine: Engine) -> None:
    silence(engine, AT, "node=n1")  # for an hour
    muted = open_(engine, FaultKind.GPU_XID, GPU, AT + timedelta(minutes=1), act=False)
    assert states(engine, muted) == [("opened", "muted")] and deliveries(engine, muted) == 0
    assert flush(engine, timedelta(minutes=30)) == 0  # still silenced
    assert [t for t, _ in timeline(engine, muted)].count("silenced") == 1  # said once
    assert flush(engine, timedelta(minutes=61)) == deliveries(engine, muted) > 0
    assert states(engine, muted) == [("opened", "done"), ("unmuted", "done")]
    assert flush(engine, timedelta(minutes=62)) == 0  # alerted once


def test_a_flush_that_lost_the_race_alerts_nothing_twice(engine: Engine) -> None:
    silence(engine, AT, "node=n1")
    muted = open_(engine, FaultKind.GPU_XID, GPU, AT + timedelta(minutes=1), act=False)
    later = AT + timedelta(minutes=61)
    with Session(engine) as slow:
        # The slow flush read the waiting entry, then the other one committed first.
        stale = list(slow.exec(select(IncidentEvent).where(IncidentEvent.incident_id == muted)))
        waiting = [e for e in stale if e.alert_state is not None]
        sent = flush(engine, timedelta(minutes=61))
        assert sent > 0
        assert alert_inbox._flush_incident(slow, muted, waiting, later) == 0
        slow.commit()
    assert deliveries(engine, muted) == sent
    assert [t for t, _ in timeline(engine, muted)].count("unmuted") == 1


def test_a_muted_alert_of_a_resolved_incident_is_dropped(engine: Engine) -> None:
    silence(engine, AT, "node=n1")
    muted = open_(engine, FaultKind.GPU_XID, GPU, AT + timedelta(minutes=1), act=False)
    with Session(engine) as s:
        inc = s.get(Incident, muted)
        assert inc is not None
        resolve_incident(s, incident=inc, now=AT + timedelta(minutes=5), why="quiet")
        flush_alerts(s, now=AT + timedelta(minutes=5))  # the resolution is muted too
        s.commit()
    assert flush(engine, timedelta(minutes=61)) == 0  # the silence ended: nothing is sent
    assert deliveries(engine, muted) == 0
    assert states(engine, muted) == [("opened", "done"), ("resolved", "done")]
    assert "unmuted" not in [t for t, _ in timeline(engine, muted)]


def test_appending_queues_nothing_and_bad_input_changes_nothing(engine: Engine) -> None:
    loud = open_(engine, FaultKind.GPU_XID, Subject(node="n2", gpu="1"), AT, act=False)
    before = deliveries(engine, loud)
    with Session(engine) as s:
        add_event(s, incident_id=loud, type_=IncidentEventType.ACTION_FAILED, at=AT)
        s.commit()
    assert deliveries(engine, loud) == before  # waits for a flush
    assert states(engine, loud)[-1] == ("action_failed", "pending")
    with Session(engine) as s:
        assert flush_alerts(s, now=AT, incident_ids=[]) == 0  # no incident: nothing looked at
        with pytest.raises(ValueError, match="'not_a_type' is not a valid IncidentEventType"):
            add_event(s, incident_id=loud, type_="not_a_type", at=AT)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="never flushed"):
            add_event(s, incident_id=None, type_=IncidentEventType.OPENED, at=AT)
        s.commit()
    assert states(engine, loud)[-1] == ("action_failed", "pending")
    assert flush(engine, timedelta(seconds=1)) > 0
    assert states(engine, loud)[-1] == ("action_failed", "done")


def test_the_stages_run_in_order_and_the_first_verdict_is_recorded(engine: Engine) -> None:
    """Inhibition, then silence, then maintenance window, as Alertmanager's pipeline."""
    silence(engine, AT, "node=n1")
    node = open_(engine, FaultKind.NODE_SILENT, Subject(node="n1"), AT, act=False)
    gpu = open_(engine, FaultKind.GPU_XID, GPU, AT + timedelta(seconds=5), act=False)
    assert "silenced" in [t for t, _ in timeline(engine, node)]
    muted_by = [t for t, _ in timeline(engine, gpu) if t in {"inhibited", "silenced"}]
    assert muted_by == ["inhibited"]


def test_a_failing_stage_keeps_the_entry_waiting_and_the_writer_goes_on(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("matcher store unreadable")

    monkeypatch.setattr(pipeline, "MUTE_STAGES", (broken,))
    inc = open_(engine, FaultKind.GPU_XID, GPU, AT)  # the tick's write still commits
    assert states(engine, inc) == [("opened", "pending")] and deliveries(engine, inc) == 0
    assert actions(engine, inc) == 1
    assert f"alert inbox: incident {inc} not flushed" in caplog.text
    monkeypatch.undo()
    assert flush(engine, timedelta(seconds=1)) == deliveries(engine, inc) > 0


class Broker(list[int]):
    def send_task(self, name: str, *, args: list[int], **_: object) -> None:
        self.append(args[0])


def test_dispatcher_passes_leave_muted_entries_to_the_periodic_flush(engine: Engine) -> None:
    """An incident storm wakes the dispatcher many times a second: its passes flush only what
    nobody asked about yet; the muted entries are asked again by the alerts job."""
    silence(engine, AT, "node=n1")
    muted = open_(engine, FaultKind.GPU_XID, GPU, AT + timedelta(minutes=1), act=False)
    after = AT + timedelta(minutes=61)  # the silence has ended
    dispatcher = OutboxDispatcher(engine=engine, celery_app=Broker())
    dispatcher.dispatch_due(now=after)
    assert deliveries(engine, muted) == 0 and states(engine, muted) == [("opened", "muted")]
    assert ask_muted_again(engine, now=after) == deliveries(engine, muted) > 0
