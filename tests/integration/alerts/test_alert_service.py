"""The delivery rows on real SQLite and PostgreSQL: queueing, dedupe, grouping claims, retries."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.alerts import queue as service
from app.alerts.delivery import AlertDeliveryClient, DeliveryRecord, DeliveryStatus, RetryPolicy
from app.alerts.errors import AlertEventError
from app.alerts.render import render_batch
from app.alerts.service import list_deliveries
from app.models.alert import AlertDelivery, DeliveryState
from tests.unit.app.alerts._factories import T0, config, event, tier_scenario
from tests.unit.app.alerts._recording_server import RecordingServer, wecom

pytestmark = pytest.mark.integration
CFG = config()
S = timedelta(seconds=1)


def three_signals() -> list:
    return [
        event(event_id="a", kind="opened", occurred_at=T0),
        event(event_id="b", kind="escalated", tier="heavy", occurred_at=T0 + 2 * S),
        event(
            event_id="c",
            kind="approval_requested",
            tier="heavy",
            approval_id=7,
            occurred_at=T0 + 5 * S,
        ),
    ]


def queue(engine: Engine, events: list, cfg=CFG) -> list[int]:  # noqa: ANN001
    with Session(engine) as session:
        ids = service.queue_events(session, events=events, config=cfg, now=T0)
        session.commit()
    return ids


def rows(engine: Engine, channel: str | None = None) -> list[AlertDelivery]:
    with Session(engine) as session:
        query = select(AlertDelivery).order_by(AlertDelivery.id)
        if channel:
            query = query.where(AlertDelivery.channel == channel)
        return list(session.exec(query).all())


def claim(engine: Engine, delivery_id: int, now, cfg=CFG):  # noqa: ANN001, ANN201
    with Session(engine) as session:
        return service.claim(session, delivery_id=delivery_id, config=cfg, now=now)


def record(engine: Engine, lead_id: int, status: DeliveryStatus, now, **kw) -> AlertDelivery:  # noqa: ANN001
    rec = DeliveryRecord(
        channel="x",
        channel_type="slack",
        status=status,
        attempts=kw.pop("attempts", 1),
        parts_total=1,
        **kw,
    )
    with Session(engine) as session:
        return service.record_result(session, lead_id=lead_id, record=rec, now=now)


def test_one_row_per_event_and_accepting_channel_and_never_twice(
    engine: Engine, database_url: str
) -> None:
    cfg = config(
        channels=[
            {"type": "slack", "name": "all", "url": "https://h.example/a", "min_tier": "light"},
            {"type": "slack", "name": "heavy", "url": "https://h.example/b", "min_tier": "heavy"},
            {
                "type": "slack",
                "name": "off",
                "url": "https://h.example/c",
                "min_tier": "light",
                "muted": True,
            },
        ]
    )
    ids = queue(engine, three_signals(), cfg)
    assert len(ids) == 5  # 3 on "all", the 2 heavy ones on "heavy", none on the muted channel
    assert queue(engine, three_signals(), cfg) == []
    # A new process (a restarted worker or server) cannot queue them again either.
    from app.core.db import make_engine

    fresh = make_engine(database_url)
    try:
        assert queue(fresh, three_signals(), cfg) == []
    finally:
        fresh.dispose()
    assert sorted(r.dedupe_key for r in rows(engine)) == sorted(
        [f"incident:42/event:{e}/channel:all" for e in "abc"]
        + [f"incident:42/event:{e}/channel:heavy" for e in "bc"]
    )


def test_group_window_then_one_claim_sends_all_three(engine: Engine) -> None:
    queue(engine, three_signals())
    slack = rows(engine, "ops-slack")
    assert claim(engine, slack[0].id, T0 + 9 * S) == service.Wait(T0 + 10 * S)
    plan = claim(engine, slack[2].id, T0 + 10 * S)  # any member's task may send the batch
    assert isinstance(plan, service.SendPlan)
    assert plan.lead_id == slack[0].id and [e.event_id for e in plan.batch.events] == [
        "a",
        "b",
        "c",
    ]
    after = rows(engine, "ops-slack")
    assert [r.state for r in after] == ["sending", "grouped", "grouped"]
    assert [r.batch_id for r in after] == [None, slack[0].id, slack[0].id]
    # The other members' tasks, and a duplicate of the lead's, find nothing to do.
    assert claim(engine, slack[1].id, T0 + 11 * S) is None
    assert claim(engine, slack[0].id, T0 + 11 * S) is None
    done = record(engine, plan.lead_id, DeliveryStatus.SENT, T0 + 12 * S, response_code=200)
    assert done.state == "sent" and done.sent_at == T0 + 12 * S and done.attempts == 1


def test_concurrent_claims_send_a_batch_once(engine: Engine) -> None:
    queue(engine, three_signals())
    ids = [r.id for r in rows(engine, "ops-slack")] * 3
    plans = []
    barrier = threading.Barrier(len(ids))

    def worker(delivery_id: int) -> None:
        barrier.wait()
        try:
            plans.append(claim(engine, delivery_id, T0 + 20 * S))
        except Exception as exc:  # a SQLite "database is locked" would land here
            plans.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    sends = [p for p in plans if isinstance(p, service.SendPlan)]
    assert len(sends) == 1 and all(p is None for p in plans if p is not sends[0]), plans


def test_transient_failure_is_retried_later_then_gives_up(engine: Engine) -> None:
    queue(engine, [event()])
    (row,) = rows(engine, "ops-slack")
    now = T0 + 10 * S
    plan = claim(engine, row.id, now)
    failed = record(
        engine,
        plan.lead_id,
        DeliveryStatus.FAILED,
        now,
        response_code=500,
        last_error="HTTP 500: x",
        parts_sent=0,
    )
    assert failed.state == "retrying" and failed.next_attempt_at == now + timedelta(minutes=1)
    assert claim(engine, row.id, now + 30 * S) == service.Wait(now + timedelta(minutes=1))
    for _ in range(2, 5):
        now = now + timedelta(minutes=16)
        plan = claim(engine, row.id, now)
        assert isinstance(plan, service.SendPlan) and plan.start_part == 0
        failed = record(
            engine,
            plan.lead_id,
            DeliveryStatus.FAILED,
            now,
            response_code=500,
            last_error="HTTP 500: x",
        )
    assert failed.state == "failed" and failed.task_runs == 4 and failed.attempts == 4
    assert claim(engine, row.id, now + timedelta(hours=1)) is None


def test_a_retry_never_comes_before_the_channel_asked(engine: Engine) -> None:
    queue(engine, [event()])
    (row,) = rows(engine, "ops-slack")
    now = T0 + 10 * S
    plan = claim(engine, row.id, now)
    later = record(
        engine, plan.lead_id, DeliveryStatus.FAILED, now, response_code=429, retry_after_s=600.0
    )
    assert later.state == "retrying" and later.next_attempt_at == now + timedelta(minutes=10)


def test_rejected_is_final(engine: Engine) -> None:
    queue(engine, [event()])
    (row,) = rows(engine, "ops-slack")
    plan = claim(engine, row.id, T0 + 10 * S)
    assert (
        record(engine, plan.lead_id, DeliveryStatus.REJECTED, T0 + 10 * S, response_code=404).state
        == "rejected"
    )
    assert claim(engine, row.id, T0 + timedelta(hours=1)) is None


def test_a_claim_whose_worker_died_is_taken_over_after_its_lease(engine: Engine) -> None:
    queue(engine, [event()])
    (row,) = rows(engine, "ops-slack")
    assert isinstance(claim(engine, row.id, T0 + 10 * S), service.SendPlan)
    # The worker was killed here: no result recorded, the row stays "sending".
    assert claim(engine, row.id, T0 + timedelta(minutes=5)) is None  # lease still live
    with Session(engine) as session:
        due = service.due_for_dispatch(session, now=T0 + timedelta(minutes=7), grace=60 * S)
    assert row.id in [i for i, _ in due]  # (beside the other channels' rows, never claimed)
    plan = claim(engine, row.id, T0 + timedelta(minutes=7))
    assert isinstance(plan, service.SendPlan) and rows(engine, "ops-slack")[0].task_runs == 2


def test_muted_or_removed_channels_suppress_queued_rows(engine: Engine) -> None:
    queue(engine, [event()])
    slack, wecom_row, hook = rows(engine)
    muted = config(
        channels=[
            {
                "type": "slack",
                "name": "ops-slack",
                "url": "https://h.example/a",
                "min_tier": "light",
                "muted": True,
            },
        ]
    )
    assert claim(engine, slack.id, T0 + 10 * S, muted) is None
    assert claim(engine, wecom_row.id, T0 + 10 * S, muted) is None
    states = {r.channel: (r.state, r.last_error) for r in rows(engine)}
    assert states["ops-slack"] == ("suppressed", "channel 'ops-slack' is muted")
    assert states["ops-wecom"] == ("suppressed", "channel 'ops-wecom' is no longer configured")
    assert states["pager"][0] == "pending"


def test_pending_rows_whose_task_was_lost_are_found_by_the_sweeper(engine: Engine) -> None:
    queue(engine, [event()])
    with Session(engine) as session:
        assert service.due_for_dispatch(session, now=T0 + 30 * S, grace=60 * S) == []
        due = service.due_for_dispatch(session, now=T0 + 71 * S, grace=60 * S)
    assert len(due) == 3


def test_dispatch_survives_a_broken_broker(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    ids = queue(engine, [event()])
    seen: list[int] = []

    def enqueue(delivery_id: int, eta) -> None:  # noqa: ANN001
        seen.append(delivery_id)
        if delivery_id == ids[1]:
            raise ConnectionError("broker down")

    with Session(engine) as session:
        assert service.dispatch(session, ids=ids, enqueue=enqueue) == 1
    # The first refusal stops the pass (the broker is down); the sweeper sends the rest later.
    assert (
        seen == ids[:2]
        and f"alert delivery {ids[1]} not enqueued (ConnectionError: broker down)" in caplog.text
    )


def test_heavy_incidents_get_one_reminder_per_interval(engine: Engine) -> None:
    cfg = config(repeat_interval_s=1800)
    queue(
        engine, tier_scenario(__import__("app.policy.signals", fromlist=["Tier"]).Tier.HEAVY), cfg
    )
    queue(engine, [event(incident_id=43, event_id="m", tier="medium")], cfg)
    with Session(engine) as session:
        assert service.queue_reminders(session, config=cfg, now=T0 + timedelta(minutes=29)) == []
        first = service.queue_reminders(session, config=cfg, now=T0 + timedelta(minutes=31))
        again = service.queue_reminders(session, config=cfg, now=T0 + timedelta(minutes=40))
        closed = service.queue_reminders(
            session, config=cfg, now=T0 + timedelta(minutes=61), is_open=lambda i: False
        )
        session.commit()
    assert len(first) == 3 and again == [] and closed == []
    reminders = [r for r in rows(engine) if r.event_kind == "reminder"]
    assert {r.event_id for r in reminders} == {"reminder-1"} and {
        r.incident_id for r in reminders
    } == {42}
    assert reminders[0].event["approval_id"] == 7
    queue(
        engine,
        [
            event(
                event_id="z", kind="resolved", tier="heavy", occurred_at=T0 + timedelta(minutes=50)
            )
        ],
        cfg,
    )
    with Session(engine) as session:
        assert service.queue_reminders(session, config=cfg, now=T0 + timedelta(minutes=95)) == []


def test_listing_and_its_bad_input(engine: Engine) -> None:
    queue(engine, three_signals())
    with Session(engine) as session:
        everything = list_deliveries(session)
        assert [r.id for r in everything] == sorted((r.id for r in everything), reverse=True)
        assert len(list_deliveries(session, channel="pager")) == 3
        assert len(list_deliveries(session, limit=2, before_id=everything[0].id)) == 2
        assert list_deliveries(session, incident_id=999) == []
        assert len(list_deliveries(session, state="pending")) == 9
        with pytest.raises(AlertEventError, match="state='lost' is not one of"):
            list_deliveries(session, state="lost")
        with pytest.raises(AlertEventError, match="limit=0"):
            list_deliveries(session, limit=0)


@pytest.mark.timeout(60)
def test_queued_rows_reach_a_real_server_once_per_channel(
    engine: Engine, server: RecordingServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cfg = config(server.url(""))
    queue(engine, three_signals(), cfg)
    server.default = wecom(0)
    now = T0 + 10 * S
    with AlertDeliveryClient(cfg, policy=RetryPolicy(max_attempts=2, base_delay_s=0.01)) as client:
        for row in rows(engine):
            plan = claim(engine, row.id, now, cfg)
            if plan is None:
                continue
            message = render_batch(plan.batch, channel=cfg.channel(plan.channel), config=cfg)
            outcome = client.send(plan.channel, message, start_part=plan.start_part)
            assert record(engine, plan.lead_id, outcome.status, now).state == "sent"
    assert len(server.requests) == 4  # slack 1, wecom markdown + mention, webhook 1
    assert DeliveryState.SENT.value in {r.state for r in rows(engine)}
