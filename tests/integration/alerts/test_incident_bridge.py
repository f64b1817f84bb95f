"""The incident service's timeline → alert rows: `add_event` only appends; the alert inbox's
flush (`flush_alerts`, run by the incident writer and by each outbox dispatcher pass) builds the
deliveries, and the dispatcher hands them to the broker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.outbox import OutboxDispatcher
from app.alerts import pipeline
from app.alerts import service as alert_service
from app.alerts.events import event_from_json
from app.alerts.grouping import AlertBatch
from app.alerts.queue import SendPlan, claim, current_view, took_queued_rows
from app.incidents.alert_inbox import flush_alerts
from app.incidents.timeline import add_event
from app.models._types import utcnow
from app.models.action import RecoveryAction
from app.models.alert import AlertDelivery
from app.models.incident import Incident, IncidentEvent, IncidentEventType
from tests.unit.app.alerts._factories import config

pytestmark = pytest.mark.integration
AT = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
CFG = config()


class Enqueued(list[tuple[int, datetime]]):
    """A Celery app as the dispatcher sees it: records the alert tasks it is sent."""

    def send_task(self, name: str, *, args: list[int], eta: datetime, **_: object) -> None:
        assert name == "alerts.deliver"
        self.append((args[0], eta))


@pytest.fixture
def enqueued() -> Iterator[Enqueued]:
    alert_service.configure(config=CFG)
    try:
        yield Enqueued()
    finally:
        alert_service.configure(config=None)


def dispatcher(
    engine: Engine, broker: object, grace: timedelta = timedelta(seconds=60)
) -> OutboxDispatcher:
    return OutboxDispatcher(engine=engine, celery_app=broker, alert_grace=grace)  # type: ignore[arg-type]


def new_incident(session: Session, tier: str = "heavy", opened_at: datetime = AT) -> Incident:
    inc = Incident(
        key="storage_unwritable/job=grpo-a",
        open_key="storage_unwritable/job=grpo-a",
        kind="storage_unwritable",
        tier=tier,
        subject={"job": "grpo-a", "node": "n0", "role": "trainer", "rank": 0},
        job="grpo-a",
        node="n0",
        summary="state_log_write_errors_total rose by 3",
        opened_at=opened_at,
        updated_at=opened_at,
    )
    session.add(inc)
    session.flush()
    return inc


def events(engine: Engine) -> list[IncidentEvent]:
    with Session(engine) as session:
        return list(session.exec(select(IncidentEvent).order_by(IncidentEvent.id)).all())  # type: ignore[arg-type]


def rows(engine: Engine) -> list[AlertDelivery]:
    with Session(engine) as session:
        return list(session.exec(select(AlertDelivery).order_by(AlertDelivery.id)).all())


def test_opened_and_approval_requested_are_queued_and_sent_after_commit(
    engine: Engine, enqueued: Enqueued
) -> None:
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.OPENED,
            at=AT,
            detail={"tier": "heavy"},
        )
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.APPROVAL_REQUESTED,
            at=AT,
            detail={"approval_id": 7},
        )
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_PLANNED,
            at=AT,
            detail={"action": "enter_safe_mode"},
        )
        assert enqueued == []  # nothing leaves before the commit
        session.commit()
        assert not took_queued_rows(session)  # appending queues nothing: the alert path decides
    waiting = [e.alert_state for e in events(engine)]
    assert waiting == ["pending", "pending", None] and rows(engine) == []
    # One dispatcher pass builds the deliveries (the entries a writer left) and sends them.
    assert dispatcher(engine, enqueued).dispatch_due().alerts_sent == 6
    assert [e.alert_state for e in events(engine)] == ["done", "done", None]
    assert dispatcher(engine, enqueued).dispatch_due().alerts_sent == 0  # sent once
    queued = rows(engine)
    assert len(queued) == 6 and sorted(i for i, _ in enqueued) == sorted(r.id for r in queued)
    assert {eta for _, eta in enqueued} == {AT + CFG.group_wait}
    opened = event_from_json(queued[0].event)
    assert (opened.kind.value, opened.tier.value, opened.fault_kind, opened.job, opened.role) == (
        "opened", "heavy", "storage_unwritable", "grpo-a", "trainer",
    )  # fmt: skip
    assert event_from_json(queued[-1].event).approval_id == 7


def test_a_rolled_back_incident_queues_nothing(engine: Engine, enqueued: Enqueued) -> None:
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=AT)
        session.rollback()
    dispatcher(engine, enqueued).dispatch_due()
    assert rows(engine) == [] and enqueued == []


@pytest.mark.parametrize(
    "type_",
    [
        IncidentEventType.UPDATED,
        IncidentEventType.ACTION_PLANNED,
        IncidentEventType.ACTION_STARTED,
        IncidentEventType.ACTION_SUCCEEDED,
        IncidentEventType.SAFE_MODE,
    ],
)
def test_entries_not_worth_a_message(
    engine: Engine, enqueued: Enqueued, type_: IncidentEventType
) -> None:
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_=type_, at=AT)
        session.commit()
        assert not took_queued_rows(session)
    dispatcher(engine, enqueued).dispatch_due()
    assert rows(engine) == [] and enqueued == []


def test_decisions_and_failures_carry_who_and_why(engine: Engine, enqueued: Enqueued) -> None:
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_=IncidentEventType.APPROVAL_GRANTED, actor="user:alice", at=AT,
                  detail={"approval_id": 7, "comment": "go"})  # fmt: skip
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.APPROVAL_EXPIRED,
            at=AT,
            detail={"approval_id": 8},
        )
        add_event(session, incident_id=inc.id, type_=IncidentEventType.ACTION_FAILED, actor="worker:vm:1", at=AT,
                  detail={"action": "restore_checkpoint", "error": "no valid checkpoint"})  # fmt: skip
        assert flush_alerts(session, now=AT) == 9  # 3 entries x 3 channels, in its transaction
        session.commit()
        assert took_queued_rows(session)  # what tells the policy tick to wake the dispatcher
    events = [event_from_json(r.event) for r in rows(engine) if r.channel == "pager"]
    granted, expired, failed = events
    assert (granted.decision.value, granted.decided_by, granted.comment) == (
        "approved",
        "alice",
        "go",
    )
    assert (expired.decision.value, expired.decided_by) == ("expired", None)
    assert (failed.kind.value, failed.failed_action, failed.error) == (
        "action_failed",
        "restore_checkpoint",
        "no valid checkpoint",
    )


def test_medium_incidents_skip_heavy_only_channels(engine: Engine, enqueued: Enqueued) -> None:
    heavy_only = config(
        channels=[
            {
                "type": "slack",
                "name": "pager-duty",
                "url": "https://h.example/x",
                "min_tier": "heavy",
            }
        ]
    )
    alert_service.configure(config=heavy_only)
    with Session(engine) as session:
        inc = new_incident(session, tier="medium")
        add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=AT)
        assert flush_alerts(session, now=AT) == 0
        session.commit()
    assert rows(engine) == []


def test_an_alerting_failure_never_blocks_the_incident(
    engine: Engine,
    enqueued: Enqueued,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_a: object, **_k: object) -> list[int]:
        raise RuntimeError("alert queue exploded")

    monkeypatch.setattr(pipeline, "queue_events", broken)
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=AT)
        assert flush_alerts(session, now=AT) == 0
        session.commit()
        incident_id = inc.id
    with Session(engine) as session:
        assert session.get(Incident, incident_id) is not None
        assert len(session.exec(select(IncidentEvent)).all()) == 1
    assert rows(engine) == [] and "not queued; the incident goes on" in caplog.text


def test_a_dead_broker_never_stalls_the_incident_and_the_rows_wait_in_the_outbox(
    engine: Engine, enqueued: Enqueued, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    class Down:
        def send_task(self, name: str, *, args: list[int], **_: object) -> None:
            calls.append(args[0])
            raise ConnectionError("redis down")

    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_="opened", at=AT)
        session.commit()  # no broker is involved in the incident's transaction at all
    report = dispatcher(engine, Down()).dispatch_due()
    assert report.alerts_sent == 0 and report.error == "ConnectionError: redis down"
    assert len(rows(engine)) == 3 and len(calls) == 1  # the first refusal ends the pass
    assert "3 row(s) wait for the next sweep" in caplog.text
    # The broker back, the next pass sends every row.
    assert dispatcher(engine, enqueued).dispatch_due().alerts_sent == 3
    assert sorted(i for i, _ in enqueued) == sorted(r.id for r in rows(engine))


def test_no_channels_means_no_work(engine: Engine) -> None:
    alert_service.configure(config=config(channels=[]))
    try:
        with Session(engine) as session:
            inc = new_incident(session)
            add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=AT)
            assert flush_alerts(session, now=AT) == 0
            session.commit()
    finally:
        alert_service.configure(config=None)
    assert rows(engine) == []


def test_the_message_shows_the_actions_as_they_are_at_send_time(
    engine: Engine, enqueued: Enqueued
) -> None:
    with Session(engine) as session:
        inc = new_incident(session)
        add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=AT)
        flush_alerts(session, now=AT)
        for n, (action, status) in enumerate(
            [
                ("enter_safe_mode", "succeeded"),
                ("restore_checkpoint", "pending_approval"),
                ("restart_role", "cancelled"),
            ]
        ):
            session.add(
                RecoveryAction(
                    incident_id=inc.id,
                    idempotency_key=f"k{n}",
                    action=action,
                    queue="cluster",
                    status=status,
                )
            )
        session.commit()
        batch = AlertBatch((event_from_json(rows(engine)[0].event),))
        assert batch.actions_taken == ()  # planned after the "opened" entry was written
        fresh = current_view(session, batch)
    assert fresh.actions_taken == (
        "enter_safe_mode (succeeded)",
        "restore_checkpoint (pending approval)",
    )
    # What the task gets when the group window closes is that same current view.
    with Session(engine) as session:
        plan = claim(session, delivery_id=rows(engine)[0].id, config=CFG, now=AT + CFG.group_wait)
    assert isinstance(plan, SendPlan) and plan.batch.actions_taken == fresh.actions_taken


def test_maintenance_reminds_open_heavy_incidents_and_purges_old_rows(
    engine: Engine, enqueued: Enqueued
) -> None:
    # Rows are stamped with the wall clock, so this test lives on it: opened 35 minutes ago.
    opened = utcnow() - timedelta(minutes=35)
    with Session(engine) as session:
        inc = new_incident(session, opened_at=opened)
        add_event(session, incident_id=inc.id, type_=IncidentEventType.OPENED, at=opened)
        session.commit()
        incident_id = inc.id
    assert dispatcher(engine, enqueued).dispatch_due().alerts_sent == 3
    enqueued.clear()  # as if the broker had lost those three tasks
    soon = utcnow() + timedelta(minutes=2)
    assert alert_service.run_alert_maintenance(engine, now=soon) == 3  # reminders queued
    # The dispatcher sends the 3 lost "opened" rows and the 3 new reminders.
    assert dispatcher(engine, enqueued).dispatch_due(now=soon).alerts_sent == 6
    assert sorted(enqueued) == sorted((r.id, r.due_at) for r in rows(engine))
    assert {r.event_id for r in rows(engine)} == {"t1", "reminder-1"}
    assert alert_service.run_alert_maintenance(engine, now=soon) == 0
    assert dispatcher(engine, enqueued).dispatch_due(now=soon).alerts_sent == 0
    with Session(engine) as session:
        session.get(Incident, incident_id).status = "resolved"  # type: ignore[union-attr]
        session.commit()
    assert alert_service.run_alert_maintenance(engine, now=soon + timedelta(minutes=60)) == 0
    # Finished rows older than the retention go; open ones stay, however old.
    with Session(engine) as session:
        for row in session.exec(select(AlertDelivery).where(AlertDelivery.event_id == "t1")).all():
            row.state = "sent"
        session.commit()
    alert_service.run_alert_maintenance(
        engine, now=soon + timedelta(days=CFG.retention_days, hours=2)
    )
    assert {r.event_id for r in rows(engine)} == {"reminder-1"}
