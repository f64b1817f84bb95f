"""A tick's decisions are written one short transaction at a time, and a waiting ingest commit
gets SQLite's write lock between two of them (app.incidents.tick_writes, app.core.write_turns)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

import app.incidents.tick_writes as tick_writes
from app.core import migrate
from app.core.db import make_engine
from app.core.write_turns import WriteTurns
from app.models.incident import Incident
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import ActionName, PlannedAction
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    return url


def opened(rank: int) -> IncidentDecision:
    subj = Subject(node="n0", job="j", role="trainer", rank=rank)
    sig = FaultSignal(
        FaultKind.HEARTBEAT_LOST,
        subj,
        Evidence(metric="m", detail="gone"),
        Tier.MEDIUM,
        100.0,
        since=90.0,
    )
    act = PlannedAction(
        ActionName.RESTART_ROLE, "j", "n0", False, {"role": "trainer", "rank": rank}
    )
    return IncidentDecision(
        DecisionType.OPEN, sig.incident_key, sig.kind, subj, Tier.MEDIUM, 100.0, sig, (act,)
    )


def test_each_decision_is_its_own_transaction_and_all_are_written(url: str) -> None:
    engine = make_engine(url)
    out = tick_writes.write_decisions(
        engine, [opened(r) for r in range(5)], policy=default_policy(), dry_run=False, chunk=1
    )
    assert out.transactions == 5
    assert len(out.persisted.opened) == 5 and len(out.persisted.new_actions) == 5
    assert out.new_rows
    with Session(engine) as s:
        incidents = s.exec(select(Incident)).all()
    assert len(incidents) == 5
    assert len({i.opened_at for i in incidents}) == 1  # one tick, one time
    engine.dispose()


def test_a_waiting_ingest_commit_writes_between_two_of_the_ticks_transactions(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(url)
    # Like the inline ingest committer: a write that finds the lock taken fails at once.
    ingest_engine = make_engine(url, sqlite_busy_timeout_ms=0)
    with ingest_engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE probe (x INTEGER)")
    turns = WriteTurns(max_wait_s=5.0)
    order: list[str] = []
    transactions = iter(range(1, 100))
    real = tick_writes.persist_decisions

    def ingest_commit() -> None:
        with turns.ingest_commit(), ingest_engine.begin() as c:
            c.execute(sa.text("INSERT INTO probe VALUES (1)"))  # "database is locked" if not
            order.append("ingest")

    ingest = threading.Thread(target=ingest_commit)

    def persist(session, **kw):  # type: ignore[no-untyped-def]
        out = real(session, **kw)
        order.append(f"tick {next(transactions)}")
        if not ingest.is_alive() and not any(o == "ingest" for o in order):
            ingest.start()  # an ingest commit arrives while the first transaction holds the lock
            deadline = time.monotonic() + 5
            while turns.ingest_waiting == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
        return out

    monkeypatch.setattr(tick_writes, "persist_decisions", persist)
    out = tick_writes.write_decisions(
        engine,
        [opened(r) for r in range(3)],
        policy=default_policy(),
        dry_run=False,
        turns=turns,
        chunk=1,
    )
    ingest.join(5)
    assert order == ["tick 1", "ingest", "tick 2", "tick 3"]
    assert out.transactions == 3 and turns.ingest_first == 1
    engine.dispose()
    ingest_engine.dispose()
