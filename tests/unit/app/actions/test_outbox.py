"""One outbox: recovery actions and alert deliveries reach the broker by the same dispatcher."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.outbox import OutboxDispatcher
from app.alerts.queue import queue_events
from app.models.action import RecoveryAction
from app.models.alert import AlertDelivery
from tests.unit.app.actions.conftest import plan, skip_step
from tests.unit.app.alerts._factories import T0, config, event

pytestmark = pytest.mark.timeout(60)


class Broker:
    """What the dispatcher uses of a Celery app: `send_task`, which may refuse."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[Any], str, datetime | None]] = []
        self.down = False

    def send_task(
        self, name: str, *, args: list[Any], queue: str, eta: datetime | None = None, **_: Any
    ) -> None:
        if self.down:
            raise ConnectionError("broker down")
        self.sent.append((name, args, queue, eta))


def dispatcher(engine: Engine, broker: Broker) -> OutboxDispatcher:
    return OutboxDispatcher(engine=engine, celery_app=broker)  # type: ignore[arg-type]


def test_actions_and_alert_deliveries_go_out_by_one_pass_each_once(engine: Engine) -> None:
    [(aid, key)] = plan(engine, skip_step())
    with Session(engine) as s:
        ids = queue_events(s, events=[event(occurred_at=T0)], config=config(), now=T0)
        s.commit()
    broker = Broker()
    report = dispatcher(engine, broker).dispatch_due()
    assert (report.sent, report.alerts_sent, report.error) == (1, 3, None)
    assert broker.sent[0] == ("recovery.skip_failed_step", [aid, key], "node.n0", None)
    alerts = broker.sent[1:]
    assert [a[1][0] for a in alerts] == ids
    assert {(a[0], a[2]) for a in alerts} == {("alerts.deliver", "cluster")}
    with Session(engine) as s:
        due = {r.due_at for r in s.exec(select(AlertDelivery)).all()}
        assert {a[3] for a in alerts} == due  # each runs when its group window closes
        assert s.get(RecoveryAction, aid).status == "dispatched"  # type: ignore[union-attr]
    assert dispatcher(engine, broker).dispatch_due().alerts_sent == 0 and len(broker.sent) == 4


def test_a_broker_that_is_down_leaves_every_row_in_the_outbox(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "rlguard.outbox")
    [(aid, _)] = plan(engine, skip_step())
    with Session(engine) as s:
        queue_events(s, events=[event(occurred_at=T0)], config=config(), now=T0)
        s.commit()
    broker = Broker()
    broker.down = True
    outbox = dispatcher(engine, broker)
    report = outbox.dispatch_due()
    assert (report.sent, report.alerts_sent, report.error) == (0, 0, "ConnectionError: broker down")
    assert "broker unavailable, 1 action(s) wait in the outbox" in caplog.text
    with Session(engine) as s:
        assert s.get(RecoveryAction, aid).status == "pending"  # type: ignore[union-attr]
    broker.down = False
    report = outbox.dispatch_due()
    assert (report.sent, report.alerts_sent, report.error) == (1, 3, None)
    assert "broker reachable again; outbox drained" in caplog.text
