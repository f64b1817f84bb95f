"""An alert-worthy timeline entry, once committed, is alerted even if the process that wrote it,
or the one flushing it, is killed with ``kill -9``: the entry waits in the database
(``alert_state``) and the next outbox dispatcher pass builds and sends its deliveries, once.
SQLite and PostgreSQL (the ``engine`` fixture of this folder: migrated, alert channels set)."""

from __future__ import annotations

import signal
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.outbox import OutboxDispatcher
from app.models.alert import AlertDelivery
from app.models.incident import Incident, IncidentEvent
from tests.harness import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AT = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)

# The writer: a worker recording a failed action commits its entry, then dies before anything
# could flush it. The flusher: a dispatcher pass killed after it claimed the entry and queued its
# rows, before its commit.
CHILD = """
import os, signal, sys
from datetime import datetime, UTC
from sqlmodel import Session
from app.alerts import pipeline, service
from app.core.db import make_engine
from app.incidents import alert_inbox as inbox
from app.incidents.alert_inbox import flush_alerts
from app.incidents.timeline import add_event
from tests.unit.app.alerts._factories import config

url, moment, incident_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
service.configure(config=config())
at = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)
with Session(make_engine(url)) as session:
    if moment == "after_the_writers_commit":
        add_event(session, incident_id=incident_id, type_="action_failed", at=at,
                  detail={"action": "restart_role", "error": "exit 1"})
        session.commit()
    else:
        def queue_then_die(*args, **kwargs):
            queued = pipeline.queue_entries(*args, **kwargs)
            session.flush()
            print(f"queued {queued} rows, not committed", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        inbox.queue_entries = queue_then_die
        flush_alerts(session, now=at)
os.kill(os.getpid(), signal.SIGKILL)
"""


class Broker(list[int]):
    def send_task(self, name: str, *, args: list[int], **_: object) -> None:
        self.append(args[0])


def _incident(engine: Engine) -> int:
    with Session(engine) as s:
        inc = Incident(key="k", open_key="k", kind="gpu_xid", tier="medium", subject={},
                       node="n1", opened_at=AT, updated_at=AT)  # fmt: skip
        s.add(inc)
        s.commit()
        assert inc.id is not None
        return inc.id


def _killed(database_url: str, moment: str, incident_id: int) -> str:
    argv = [sys.executable, "-c", CHILD, database_url, moment, str(incident_id)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stderr


def test_an_entry_committed_by_a_writer_killed_at_once_is_alerted_by_the_next_pass(
    engine: Engine, database_url: str
) -> None:
    incident_id = _incident(engine)
    _killed(database_url, "after_the_writers_commit", incident_id)
    with Session(engine) as s:
        [entry] = s.exec(select(IncidentEvent)).all()
        assert (entry.type, entry.alert_state) == ("action_failed", "pending")
    broker = Broker()
    assert OutboxDispatcher(engine=engine, celery_app=broker).dispatch_due().alerts_sent == 3
    with Session(engine) as s:
        rows = s.exec(select(AlertDelivery)).all()
    assert sorted(broker) == sorted(r.id or 0 for r in rows) and {r.event_id for r in rows} == {
        "t1"
    }


def test_a_flush_killed_before_its_commit_leaves_the_entry_for_the_next_pass(
    engine: Engine, database_url: str
) -> None:
    incident_id = _incident(engine)
    _killed(database_url, "after_the_writers_commit", incident_id)
    said = _killed(database_url, "in_the_flush_before_its_commit", incident_id)
    assert "queued 3 rows, not committed" in said  # killed where it was meant to be
    with Session(engine) as s:
        assert s.exec(select(AlertDelivery)).all() == []  # the killed flush committed nothing
        [entry] = s.exec(select(IncidentEvent)).all()
        assert entry.alert_state == "pending"
    broker = Broker()
    dispatcher = OutboxDispatcher(engine=engine, celery_app=broker)
    assert dispatcher.dispatch_due().alerts_sent == 3
    assert dispatcher.dispatch_due().alerts_sent == 0  # once
    with Session(engine) as s:
        assert len(s.exec(select(AlertDelivery)).all()) == 3
