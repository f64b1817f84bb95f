"""An incident closed by its approved plan stays closed for the same occurrence of its signal,
also across a resync of the policy engine (a failed database write, the scheduler lease taken
back), and a genuinely new occurrence opens a new incident.

The scheduler tests drive the real ``PolicyScheduler.tick`` on a migrated SQLite database; the
service closes the incident the way a completed approved restore does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.core import migrate
from app.core.db import make_engine
from app.incidents.persist import resolve_incident
from app.incidents.queries import open_incidents_for_engine
from app.models._types import utcnow
from app.models.incident import Incident
from app.policy.clock import ManualClock
from app.policy.engine import DecisionType, Occurrence, PolicyEngine
from app.policy.signals import FaultKind, Tier
from app.scheduler import PolicyScheduler
from recovery.protocol import metric_names as m

from ._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(60)

T = {"job": JOB, "role": "trainer", "rank": "0"}


def _errors(value: float):
    def feed(c: Cluster) -> None:
        c.participant("trainer", 0, "n0", step=20)
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.9, gpu="0")
        c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, value, **T)

    return feed


def test_a_fresh_engine_given_the_closed_occurrences_does_not_reopen() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _errors(0), engine=e)
    [opened] = c.run(1, _errors(2), engine=e)
    assert opened.type is DecisionType.OPEN and opened.tier is Tier.HEAVY
    e.forget(opened.key)
    assert opened.signal is not None
    assert e.closed_occurrences == {
        opened.key: Occurrence(opened.signal.since, opened.signal.extra["newest_at"])
    }
    # a resync: the same detectors, no open incidents, the closed occurrences carried over
    fresh = PolicyEngine(c.policy, detectors=e.detectors, closed_occurrences=e.closed_occurrences)
    assert c.run(20, _errors(2), engine=fresh) == []
    # without that memory the very same occurrence opens a second incident (what it guards)
    blank = PolicyEngine(c.policy, detectors=e.detectors)
    [dup] = c.run(1, _errors(2), engine=blank)
    assert dup.type is DecisionType.OPEN and dup.key == opened.key


def test_new_errors_after_the_closure_are_a_new_occurrence_even_within_the_window() -> None:
    # The restore completed and the incident closed, but the storage still fails: the counter
    # rises again within the error window (the detector's episode, and its ``since``, go on).
    # That is new evidence after the closure: a new incident, not silence.
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _errors(0), engine=e)
    [opened] = c.run(1, _errors(2), engine=e)
    assert c.run(5, _errors(2), engine=e) == []
    e.forget(opened.key)
    assert c.run(5, _errors(2), engine=e) == []  # the same errors: nothing
    [again] = c.run(1, _errors(4), engine=e)
    assert again.type is DecisionType.OPEN and again.key == opened.key
    assert again.signal is not None and opened.signal is not None
    assert again.signal.since == opened.signal.since  # the detector's episode went on
    assert again.tier is Tier.HEAVY


def test_an_occurrence_closed_without_known_newest_evidence_is_matched_by_since() -> None:
    # After a server restart the engine restores open incidents from the database, which
    # knows only ``since``: closing such an incident still suppresses its occurrence.
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _errors(0), engine=e)
    [opened] = c.run(1, _errors(2), engine=e)
    assert opened.signal is not None
    fresh = PolicyEngine(
        c.policy,
        detectors=e.detectors,
        closed_occurrences={opened.key: Occurrence(opened.signal.since)},
    )
    assert c.run(10, _errors(2), engine=fresh) == []


def test_restoring_an_open_incident_clears_its_closed_occurrence() -> None:
    c = Cluster()
    e = PolicyEngine(c.policy)
    c.run(3, _errors(0), engine=e)
    [opened] = c.run(1, _errors(2), engine=e)
    remembered = dict(e.open_incidents)
    e.forget(opened.key)
    fresh = PolicyEngine(c.policy, detectors=e.detectors, closed_occurrences=e.closed_occurrences)
    fresh.restore(list(remembered.values()))  # the database holds it open again
    assert fresh.closed_occurrences == {}
    assert set(fresh.open_incidents) == {opened.key}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    migrate.upgrade(url)
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _scheduler(db: Engine, c: Cluster) -> PolicyScheduler:
    clock = ManualClock(c.now)
    sched = PolicyScheduler(
        engine=db,
        store=c.store,
        participants=lambda: list(c.participants.values()),
        dispatcher=None,
        policy=c.policy,
        clock=clock,
    )
    return sched


def _run(sched: PolicyScheduler, c: Cluster, seconds: int, feed) -> None:
    for _ in range(seconds):
        c.now += 1.0
        feed(c)
        sched.clock.advance_to(c.now)  # type: ignore[attr-defined]
        assert sched.tick() is not None  # this replica holds the lease


def _storage_incidents(db: Engine) -> list[Incident]:
    with Session(db) as s:
        return list(
            s.exec(
                select(Incident).where(Incident.kind == FaultKind.STORAGE_UNWRITABLE.value)
            ).all()
        )


def _close_as_the_approved_plan_does(db: Engine) -> None:
    with Session(db) as s:
        [inc] = s.exec(select(Incident).where(Incident.status == "open")).all()
        resolve_incident(s, incident=inc, now=utcnow(), why="the approved recovery plan completed")
        s.commit()


@pytest.mark.parametrize("resync", ["none", "before_forget", "after_forget"])
def test_scheduler_does_not_reopen_the_same_occurrence_even_across_a_resync(
    db: Engine, resync: str
) -> None:
    c = Cluster()
    sched = _scheduler(db, c)
    _run(sched, c, 3, _errors(0))
    _run(sched, c, 2, _errors(3))
    [inc] = _storage_incidents(db)
    assert inc.status == "open" and inc.tier == Tier.HEAVY.value
    _close_as_the_approved_plan_does(db)
    if resync == "before_forget":
        sched._needs_restore = True  # what a failed write or a lease change leaves behind
    _run(sched, c, 1, _errors(3))
    if resync == "after_forget":
        sched._needs_restore = True
    # the same counter episode goes on being reported for the rest of its error window
    _run(sched, c, 20, _errors(3))
    assert [(i.id, i.status) for i in _storage_incidents(db)] == [(inc.id, "resolved")]
    with Session(db) as s:
        assert open_incidents_for_engine(s) == []


def test_scheduler_opens_a_new_incident_for_a_new_occurrence(db: Engine) -> None:
    c = Cluster()
    sched = _scheduler(db, c)
    _run(sched, c, 3, _errors(0))
    _run(sched, c, 2, _errors(3))
    _close_as_the_approved_plan_does(db)
    window = c.policy.detection.storage.error_window_seconds
    _run(sched, c, int(window) + 5, _errors(3))  # the episode ends: no new write errors
    sched._needs_restore = True
    assert len(_storage_incidents(db)) == 1
    _run(sched, c, 2, _errors(5))  # the storage fails again: a new occurrence
    rows = _storage_incidents(db)
    assert [i.status for i in rows] == ["resolved", "open"]
    assert rows[1].evidence["since"] != rows[0].evidence["since"]


def test_an_open_the_database_never_got_is_made_again_after_the_resync(
    db: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    import app.incidents.tick_writes as scheduler_module

    c = Cluster()
    sched = _scheduler(db, c)
    _run(sched, c, 3, _errors(0))
    _run(sched, c, 2, _errors(3))
    _close_as_the_approved_plan_does(db)  # an earlier occurrence, closed
    _run(sched, c, int(c.policy.detection.storage.error_window_seconds) + 5, _errors(3))
    real = scheduler_module.persist_decisions
    calls = []

    def fails_once(session, **kw):  # type: ignore[no-untyped-def]
        calls.append(kw["decisions"])
        if len(calls) == 1:
            raise OperationalError("INSERT", {}, Exception("database is locked"))
        return real(session, **kw)

    monkeypatch.setattr(scheduler_module, "persist_decisions", fails_once)
    c.now += 1.0
    _errors(5)(c)
    sched.clock.advance_to(c.now)  # type: ignore[attr-defined]
    assert sched.tick() is None  # the write of the new incident failed: resync next tick
    assert [d.type for d in calls[0]] == [DecisionType.OPEN]
    _run(sched, c, 2, _errors(5))
    assert [i.status for i in _storage_incidents(db)] == ["resolved", "open"]


def test_a_resync_keeps_which_nodes_just_came_back() -> None:
    from app.scheduler import _fresh_engine_keeping_detectors

    c = Cluster()
    old = PolicyEngine(c.policy)
    old.node_returns.update(100.0, {"n0": 70.0})
    old.node_returns.update(101.0, {"n0": 100.5})
    fresh = _fresh_engine_keeping_detectors(old, c.policy)
    assert fresh.node_returns.update(102.0, {"n0": 101.5}) == {"n0": 100.5}
