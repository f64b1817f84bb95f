"""The event path (a certain fault ticks at once, ``app.ingest.certain`` → ``PolicyScheduler.nudge``)
and the interval tick never both act on one fault.

The real server app (its lifespan: ingest, the policy scheduler with its event thread and its
interval jobs, the outbox), on SQLite and on PostgreSQL. For each of many faults, a launcher-seen
exit is ingested through ``IngestService.ingest`` (validation, group commit, the post-commit
notification) while threads released by one barrier (as the exit goes in, or at its ack, when the
event thread has just been nudged) run the interval tick of the lease holder and the tick of a
second replica on the same database: exactly one incident and one action row per fault, whoever
got there first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import orjson
import pytest
from sqlmodel import Session, col, select

from app.auth.tokens import create_node_token
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.main import create_app
from app.models.action import RecoveryAction
from app.models.incident import Incident
from app.policy.world import participants_from_ingest
from app.scheduler import PolicyScheduler

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

FAULTS = 15
TICKERS = 3  # threads running the holder's interval tick against each exit
NODE = "n0"


def _body(seq: int, job: str, phase: str) -> bytes:
    return orjson.dumps(
        {
            "agent_id": "race",
            "node": NODE,
            "seq": seq,
            "sent_at": time.time(),
            "samples": [],
            "participants": [
                {
                    "job": job,
                    "role": "trainer",
                    "rank": 0,
                    "phase": phase,
                    "step": 50,
                    "ts": time.time(),
                }
            ],
            "fingerprint": None,
        }
    )


def _race(database_url: str, tmp_path: Path) -> tuple[int, int]:
    """Runs the race; returns (event ticks run, interval ticks run by the racing threads)."""
    app = create_app(Settings(dev=True, database_url=database_url, data_dir=tmp_path / "data"))
    racing_ticks = 0

    async def scenario() -> int:
        nonlocal racing_ticks
        async with app.router.lifespan_context(app):
            sched: PolicyScheduler = app.state.policy_scheduler
            ingest = app.state.ingest
            assert sched.is_leader()
            # Another server replica on the same database: never the lease holder, so its tick
            # must do nothing at all, however it races.
            replica = PolicyScheduler(
                engine=app.state.engine,
                store=app.state.series_store,
                participants=participants_from_ingest(ingest),
                dispatcher=None,
                policy=sched.policy,
            )
            seq = 0
            for i in range(FAULTS):
                job = f"race{i:03d}"
                seq += 1
                await ingest.ingest(_body(seq, job, "TRAIN"), token_node=NODE)
                barrier = threading.Barrier(TICKERS + 2)
                results: list[object] = []

                def tick_holder(
                    b: threading.Barrier = barrier, out: list[object] = results
                ) -> None:
                    b.wait()
                    out.append(sched.tick())

                def tick_replica(
                    b: threading.Barrier = barrier, out: list[object] = results
                ) -> None:
                    b.wait()
                    out.append(("replica", replica.tick()))

                threads = [threading.Thread(target=tick_holder) for _ in range(TICKERS)]
                threads.append(threading.Thread(target=tick_replica))
                for t in threads:
                    t.start()
                seq += 1
                exit_batch = _body(seq, job, "EXITED")
                if i % 2:  # the ticks start as the exit goes in (before its commit)
                    await asyncio.to_thread(barrier.wait)
                    await ingest.ingest(exit_batch, token_node=NODE)
                else:  # the ticks start at its ack, when the event thread has just been nudged
                    await ingest.ingest(exit_batch, token_node=NODE)
                    await asyncio.to_thread(barrier.wait)
                for t in threads:
                    await asyncio.to_thread(t.join, 60)
                    assert not t.is_alive()
                assert ("replica", None) in results  # the replica never ticked
                racing_ticks += sum(
                    1 for r in results if r is not None and not isinstance(r, tuple)
                )
            # Every fault is planned (by whichever path) before the app stops; stopping joins
            # the event thread, so no tick is still writing when the rows are counted.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with Session(app.state.engine) as s:
                    if len(s.exec(select(Incident.id)).all()) >= FAULTS:
                        break
                await asyncio.sleep(0.05)
            return sched.event_ticks

    event_ticks = asyncio.run(scenario())
    return event_ticks, racing_ticks


def test_the_event_path_and_the_tick_plan_each_fault_once(
    database_url: str, tmp_path: Path
) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    with Session(engine) as s:
        create_node_token(s, node=NODE, actor="test")  # the node ingest reports for
        s.commit()
    event_ticks, racing_ticks = _race(database_url, tmp_path)
    try:
        with Session(engine) as s:
            incidents = s.exec(select(Incident).order_by(col(Incident.id))).all()
            actions = s.exec(select(RecoveryAction)).all()
    finally:
        engine.dispose()
    by_job: dict[str, list[Incident]] = {}
    for inc in incidents:
        by_job.setdefault(str(inc.job), []).append(inc)
    assert sorted(by_job) == [f"race{i:03d}" for i in range(FAULTS)], by_job.keys()
    for job, incs in by_job.items():
        assert [i.kind for i in incs] == ["heartbeat_lost"], (job, incs)
        planned = [a for a in actions if a.incident_id == incs[0].id]
        assert [a.action for a in planned] == ["restart_role"], (job, planned)
    assert len(actions) == FAULTS
    # Both paths really raced: the ingest notification ran early ticks, the threads ticked.
    assert event_ticks >= 1 and racing_ticks == FAULTS * TICKERS, (event_ticks, racing_ticks)
