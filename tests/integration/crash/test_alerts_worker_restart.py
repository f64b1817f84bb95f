"""Dedupe across worker restarts, with a real Celery worker process killed by SIGKILL.

- After a worker is killed and replaced, repeated tasks and a repeated event change nothing:
  each event went out once per channel.
- A worker killed in the middle of a POST leaves its row claimed; once the claim's lease ran
  out, the sweeper hands it to the new worker, which sends it again. The receiver then sees
  that one message twice, with the same `dedupe_key` (at-least-once, documented in
  app/alerts/webhook.py), and the row ends `sent`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.actions.outbox import OutboxDispatcher
from app.alerts import service as alert_service
from app.alerts.config import load_alerts_config
from app.alerts.queue import due_for_dispatch, queue_events
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.models._types import utcnow
from app.models.alert import AlertDelivery
from app.tasks.celery_app import make_celery
from tests.harness import REPO, RedisServer, kill_group, start_worker, wait_for
from tests.integration.alerts.test_alerts_e2e import alerts_file
from tests.unit.app.alerts._factories import T0, event
from tests.unit.app.alerts._recording_server import RecordingServer, Reply, wecom

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


class Rig:
    def __init__(
        self, tmp: Path, database_url: str, redis: RedisServer, server: RecordingServer
    ) -> None:
        self.tmp = tmp
        self.alerts_path = alerts_file(tmp / "alerts.yaml", server)
        self.config = load_alerts_config(self.alerts_path)
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "RLGUARD_DEV": "1",
            "RLGUARD_DATA_DIR": str(tmp / "data"),
            "RLGUARD_DATABASE_URL": database_url,
            "RLGUARD_REDIS_URL": redis.url,
            "RLGUARD_ALERTS_FILE": str(self.alerts_path),
        }
        migrate.upgrade(database_url)
        self.engine: Engine = make_engine(database_url)
        self.celery = make_celery(
            Settings(
                dev=True, database_url=database_url, redis_url=redis.url, data_dir=tmp / "data"
            )
        )
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self) -> subprocess.Popen[bytes]:
        # The production entry point; it consumes the cluster queue, where alerts go.
        proc = start_worker(
            "--concurrency", "1", env=self.env, log=self.tmp / f"worker{len(self.workers)}.log"
        )
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        kill_group(proc)

    def enqueue(self, delivery_id: int, eta: object = None) -> None:
        self.celery.send_task("alerts.deliver", args=[delivery_id], queue="cluster", retry=False)

    def rows(self) -> list[AlertDelivery]:
        with Session(self.engine) as session:
            return list(session.exec(select(AlertDelivery).order_by(AlertDelivery.id)).all())

    def close(self) -> None:
        for proc in self.workers:
            self.kill(proc)
        self.engine.dispose()


@pytest.fixture
def rig(tmp_path: Path, postgres_url: str, server: RecordingServer) -> Iterator[Rig]:
    redis = RedisServer(tmp_path)
    redis.start()
    r = Rig(tmp_path, postgres_url, redis, server)
    try:
        yield r
    finally:
        r.close()
        redis.stop()


def wait(pred: Callable[[], object], timeout: float, what: str, rig: Rig) -> None:
    def worker_logs() -> str:
        return "\n".join(p.read_text()[-2000:] for p in rig.tmp.glob("worker*.log"))

    wait_for(pred, timeout, what, context=worker_logs)


def broker_drained(rig: Rig) -> bool:
    """No task waits in the cluster queue and none is taken but unacknowledged (acks_late: a
    task is acknowledged once it finished), in two readings a moment apart (a message is
    briefly in neither place while the worker takes it)."""
    client = redis.Redis.from_url(rig.env["RLGUARD_REDIS_URL"], socket_timeout=5)
    try:
        for attempt in range(2):
            if attempt:
                time.sleep(0.3)  # the scenario: two readings a moment apart
            queued = sum(
                client.llen(k) for k in client.scan_iter("cluster*") if client.type(k) == b"list"
            )
            if queued or client.hlen("unacked"):
                return False
        return True
    finally:
        client.close()


def queue(rig: Rig) -> list[int]:
    with Session(rig.engine) as session:
        ids = queue_events(session, events=[event(occurred_at=T0)], config=rig.config, now=utcnow())
        session.commit()
    return ids


def test_repeats_after_a_worker_restart_send_nothing_twice(
    rig: Rig, server: RecordingServer
) -> None:
    server.default = wecom(0)
    first = rig.start_worker()
    ids = queue(rig)
    assert len(ids) == 3
    for i in ids:
        rig.enqueue(i)
    wait(
        lambda: len(server.requests) == 3 and all(r.state == "sent" for r in rig.rows()),
        60,
        "three sends",
        rig,
    )
    wait(lambda: broker_drained(rig), 60, "the first worker to acknowledge its tasks", rig)
    rig.kill(first)
    rig.start_worker()
    assert queue(rig) == []  # the same event again: the unique dedupe key refuses it
    for i in ids:  # what a broker redelivery would do, twice over
        rig.enqueue(i)
        rig.enqueue(i)
    # Every repeat was taken and finished by the new worker (a fixed sleep could end before
    # the new worker even consumes, and the asserts below would then prove nothing).
    wait(lambda: broker_drained(rig), 60, "the repeats to be consumed", rig)
    assert len(server.requests) == 3
    assert [(r.state, r.attempts, r.task_runs) for r in rig.rows()] == [("sent", 1, 1)] * 3


def test_a_worker_killed_mid_send_is_replaced_and_the_message_goes_out(
    rig: Rig, server: RecordingServer
) -> None:
    server.default = wecom(0)
    server.reply(Reply(hang=True))  # the first POST never gets an answer
    worker = rig.start_worker()
    ids = queue(rig)
    rig.enqueue(ids[-1])  # the webhook channel's row
    wait(lambda: len(server.requests) == 1, 60, "the hanging POST", rig)
    rig.kill(worker)  # SIGKILL while the POST is in flight
    (row,) = [r for r in rig.rows() if r.id == ids[-1]]
    assert row.state == "sending" and row.task_runs == 1
    rig.start_worker()

    def due() -> list[int]:
        with Session(rig.engine) as session:
            return [
                i for i, _ in due_for_dispatch(session, now=utcnow(), grace=timedelta(seconds=1))
            ]

    assert ids[-1] not in due()  # the dead worker's claim is still live
    wait_for(
        lambda: ids[-1] in due(), rig.config.claim_lease_s + 5, "the dead worker's claim to lapse"
    )
    alert_service.configure(config=rig.config)
    try:  # what the server's scheduler runs every few seconds
        reminders = alert_service.run_alert_maintenance(rig.engine)
        report = OutboxDispatcher(
            engine=rig.engine, celery_app=rig.celery, alert_grace=timedelta(seconds=1)
        ).dispatch_due()
    finally:
        alert_service.configure(config=None)
    # the killed row, and the two rows never enqueued
    assert report.alerts_sent == 3 and reminders == 0 and report.error is None
    wait(
        lambda: next(r for r in rig.rows() if r.id == ids[-1]).state == "sent",
        60,
        "the resend",
        rig,
    )
    hooks = [json.loads(r.body) for r in server.requests if r.path == "/hook"]
    assert len(hooks) == 2 and hooks[0]["dedupe_key"] == hooks[1]["dedupe_key"]
    (row,) = [r for r in rig.rows() if r.id == ids[-1]]
    assert row.task_runs == 2 and row.attempts == 1  # the killed run recorded nothing
    wait(lambda: all(r.state == "sent" for r in rig.rows()), 60, "the other channels", rig)
    paths = [r.path for r in server.requests]
    assert len(paths) == 4 and paths.count("/hook") == 2
