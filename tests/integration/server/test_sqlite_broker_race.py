"""Several processes declaring the same queues on one fresh SQLite broker file at once (the
server's dispatcher and the embedded worker both declare ``node.<n>`` in `rlguard up`).

kombu's own SQLAlchemy transport guards a queue row with a thread lock only: with the stock
transport this test fails with ``IntegrityError: UNIQUE constraint failed: kombu_queue.name``
(or "table kombu_queue already exists"). ``app.tasks.sqlite_broker`` must let every declarer
through, with one row per queue. One race on a fresh file failed about one time in six with
the table-creation retry this transport used to have (CI, 2026-12-02), so the test races on
several fresh files.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from pathlib import Path

import pytest

from app.tasks.sqlite_broker import TRANSPORT, broker_file_url

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

DECLARERS = 8
QUEUES = [f"node.n{i}" for i in range(40)]
ROUNDS = 6  # fresh broker files, each raced once


def _declare_all(url: str, transport: str, start: object, errors: object) -> None:
    from kombu import Connection

    try:
        start.wait(30)  # type: ignore[attr-defined]  # all declarers go at the same moment
        with Connection(url, transport=transport) as conn:
            channel = conn.channel()
            for name in QUEUES:
                channel.queue_declare(queue=name)
            channel.close()
    except Exception:
        errors.put(traceback.format_exc())  # type: ignore[attr-defined]
        raise


def race_declarers(broker: Path, transport: str) -> list[str]:
    """Run DECLARERS processes against a fresh broker file; the tracebacks of those that died."""
    # Forked from a fresh single-threaded server (no inherited threads or locks) that imported
    # kombu and the transport once: with "spawn" every declarer imported them itself, and on a
    # loaded CI host 6 rounds of 8 such starts outran the test's time before any declared.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["kombu", "app.tasks.sqlite_broker"])
    start, errors = ctx.Barrier(DECLARERS), ctx.Queue()
    procs = [
        ctx.Process(target=_declare_all, args=(broker_file_url(broker), transport, start, errors))
        for _ in range(DECLARERS)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(45)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    stuck = [p.pid for p in procs if p.exitcode is None]
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    assert not stuck, f"declarers {stuck} did not finish"
    return failures


def test_concurrent_declarers_on_a_fresh_broker_file_all_succeed(tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        broker = tmp_path / f"round{round_}" / "broker" / "celery-broker.sqlite"  # dir is new
        failures = race_declarers(broker, TRANSPORT)
        assert not failures, f"round {round_}: {failures[0]}"
        with sqlite3.connect(broker) as db:
            names = [r[0] for r in db.execute("SELECT name FROM kombu_queue ORDER BY id")]
        assert sorted(names) == sorted(QUEUES)  # one row per queue, none lost, none doubled
        assert broker.parent.stat().st_mode & 0o777 == 0o700
        lock = broker.with_name(broker.name + ".lock")
        assert lock.stat().st_mode & 0o777 == 0o600
