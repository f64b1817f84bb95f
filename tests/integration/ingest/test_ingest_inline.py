"""SQLite group commits on the event loop (app.ingest.commit.sqlite_loop): used when the database is
free, never waiting on a lock on the loop, paused after a slow commit, never for PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from app.core import migrate
from app.core.config import Settings
from app.ingest.commit import choose_committer
from app.ingest.commit import sqlite_loop as inline_module
from app.ingest.commit.sqlite_loop import InlineSqliteCommitter, SqliteLoopCommitter
from app.ingest.persist import IngestGroup, NodeSeen
from app.models import IngestCursor, utcnow
from app.series.backend import LocalSeriesBackend
from tests.harness import Api, auth, batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _cursors(api: Api) -> list[tuple[str, int]]:
    t = IngestCursor.__table__  # type: ignore[attr-defined]
    with api.engine.connect() as conn:
        return sorted((r[0], r[1]) for r in conn.execute(sa.select(t.c.node_name, t.c.high_seq)))


def _post(api: Api, token: str, node: str, seq: int):  # type: ignore[no-untyped-def]
    return api.client.post("/api/v1/ingest", json=batch(node, seq, n=4), headers=auth(token))


@pytest.fixture
def sqlite_api(sqlite_url: str, make_api: Callable[..., Api]) -> Api:
    migrate.upgrade(sqlite_url)
    return make_api(sqlite_url, ingest={"commit_timeout_seconds": 20})


def test_free_database_commits_inline_and_durably(sqlite_api: Api) -> None:
    token = sqlite_api.node_token("node-a")
    for seq in range(3):
        assert _post(sqlite_api, token, "node-a", seq).json() == {"accepted": 4, "duplicate": False}
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    assert inline is not None
    assert inline.inline_commits >= 1 and inline.fallbacks == 0
    assert _cursors(sqlite_api) == [("node-a", 2)]


def test_locked_database_falls_back_to_the_thread_and_the_loop_keeps_answering(
    sqlite_api: Api, sqlite_url: str
) -> None:
    token = sqlite_api.node_token("node-a")
    blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock for 2 s
    result: dict[str, object] = {}

    def send() -> None:
        result["response"] = _post(sqlite_api, token, "node-a", 7)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        time.sleep(0.5)  # the batch is queued and its commit is waiting for the lock
        started = time.monotonic()
        assert sqlite_api.client.get("/healthz").status_code == 200
        assert time.monotonic() - started < 1.0  # the event loop is not stuck on the lock
        assert "response" not in result  # not acknowledged while not durable
    finally:
        time.sleep(1.5)  # the scenario: the lock is held well past the commit's first attempt
        blocker.execute("ROLLBACK")
        blocker.close()
    sender.join(30)
    assert result["response"].json() == {"accepted": 4, "duplicate": False}  # type: ignore[attr-defined]
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    assert inline.fallbacks >= 1
    assert _cursors(sqlite_api) == [("node-a", 7)]


def test_a_slow_inline_commit_sends_commits_to_the_thread_for_the_cooldown(
    sqlite_url: str,
) -> None:
    migrate.upgrade(sqlite_url)
    now = [1000.0]
    committer = InlineSqliteCommitter(
        sqlite_url,
        sqlite_synchronous="FULL",
        max_ms=1e-6,
        cooldown_s=5.0,
        clock=lambda: now[0],
        cpu_timer=lambda: 0.0,  # all of a commit's time counts as waiting on the disk
    )
    try:
        group = IngestGroup()
        group.cursors[("node-a", "agent-1")] = (1, 1)
        assert committer.try_commit(group, None) is True  # the first compiles: not judged
        group.cursors[("node-a", "agent-1")] = (2, 3)
        assert committer.try_commit(group, None) is True  # committed, but far slower than 1 ns
        group.cursors[("node-a", "agent-1")] = (3, 7)
        assert committer.try_commit(group, None) is False  # paused: nothing written
        with committer.engine.connect() as conn:
            t = IngestCursor.__table__  # type: ignore[attr-defined]
            assert conn.execute(sa.select(t.c.high_seq)).scalar_one() == 2
        now[0] += 5.1
        assert committer.try_commit(group, None) is True  # tried again after the cooldown
    finally:
        committer.close()


def test_never_for_postgresql_or_when_turned_off(postgres_url: str, sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="SQLite only"):
        InlineSqliteCommitter(postgres_url, sqlite_synchronous="FULL", max_ms=3)

    def inline(settings: Settings) -> bool:
        engine = sa.create_engine(settings.db_url)
        return isinstance(choose_committer(settings, engine, LocalSeriesBackend()),
                          SqliteLoopCommitter)  # fmt: skip

    assert inline(Settings(dev=True, database_url=sqlite_url))
    assert not inline(Settings(dev=True, database_url=postgres_url))
    off = Settings(dev=True, database_url=sqlite_url, ingest={"inline_commit_max_ms": 0})  # type: ignore[arg-type]
    assert not inline(off)


@pytest.mark.parametrize("bad", [-1, 201, "fast"])
def test_bad_inline_setting_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValidationError, match="inline_commit_max_ms"):
        Settings(dev=True, ingest={"inline_commit_max_ms": bad})  # type: ignore[arg-type]


def test_one_slow_commit_among_fast_ones_does_not_pause_inline(sqlite_url: str) -> None:
    """Being descheduled for a moment (a loaded machine) must not send commits to the thread;
    only a sustained slowdown does."""
    migrate.upgrade(sqlite_url)
    durations = [0.001] * 5 + [0.09] + [0.001] * 3 + [0.06] * 20
    stamps = [t for k, d in enumerate(durations) for t in (10.0 * k, 10.0 * k + d)]
    committer = InlineSqliteCommitter(
        sqlite_url,
        sqlite_synchronous="FULL",
        max_ms=50,
        timer=iter(stamps).__next__,
        cpu_timer=lambda: 0.0,  # the durations are all waiting
    )
    try:
        group = IngestGroup()
        results = []
        for seq in range(20):
            group.cursors[("node-a", "agent-1")] = (seq, 1)
            results.append(committer.try_commit(group, None))
        # 5 fast commits, a 90 ms blip, 3 fast: all inline. Then 60 ms commits (1.2 x the
        # limit): the average crosses 50 ms only after several, and the next one is refused.
        first_refused = results.index(False)
        assert first_refused > 10
        assert results[:first_refused] == [True] * first_refused
        assert committer.inline_commits == first_refused
    finally:
        committer.close()


def _wal_frames(sqlite_url: str) -> int:
    """Frames in the WAL now (from a connection of our own, which also copies what it can)."""
    conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"))
    try:
        _busy, log, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(log)
    finally:
        conn.close()


def test_inline_commits_never_checkpoint_on_the_loop_and_the_background_one_does(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(sqlite_url)
    wal = Path(sqlite_url.removeprefix("sqlite:///") + "-wal")
    committer = InlineSqliteCommitter(sqlite_url, sqlite_synchronous="FULL", max_ms=200)
    monkeypatch.setattr(inline_module, "CHECKPOINT_EVERY_COMMITS", 10_000)
    group = IngestGroup()

    def commit(seq: int) -> None:
        group.nodes = {f"node-{seq % 50}": NodeSeen("agent-1", utcnow(), None)}
        group.cursors = {(f"node-{seq % 50}", "agent-1"): (seq, 1)}
        assert committer.try_commit(group, None)

    try:
        with committer.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one() == 0
        for seq in range(1500):
            commit(seq)
        # SQLite's automatic checkpoint (after 1000 pages) would have let the WAL start over:
        # it would have stayed near 1000 pages. Every inline commit's frames are still in it.
        assert wal.stat().st_size > 1500 * 4096

        async def checkpoint_in_the_background() -> None:
            monkeypatch.setattr(inline_module, "CHECKPOINT_EVERY_COMMITS", 1500)
            committer.maybe_checkpoint()  # due: 1500 commits since the last one
            committer.maybe_checkpoint()  # one at a time: not started again
            await committer.checkpoint_finished()

        asyncio.run(checkpoint_in_the_background())
        assert committer.checkpoints == 1
        commit(1500)  # everything was copied: this commit starts the WAL over
        assert _wal_frames(sqlite_url) < 20
    finally:
        committer.close()


def test_the_server_checkpoints_in_the_background_as_it_commits(
    sqlite_api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline_module, "CHECKPOINT_EVERY_COMMITS", 2)
    token = sqlite_api.node_token("node-a")
    for seq in range(5):
        assert _post(sqlite_api, token, "node-a", seq).status_code == 200
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    wait_for(lambda: inline.checkpoints >= 2, timeout=20, what="two background checkpoints")
    assert _cursors(sqlite_api) == [("node-a", 4)]


def test_a_commit_slowed_by_its_own_cpu_work_does_not_pause_inline(sqlite_url: str) -> None:
    """A garbage-collector pass inside a commit is CPU time, which the thread path would spend
    as well: only the time a commit waits (its wall time less its CPU time) is judged."""
    migrate.upgrade(sqlite_url)
    wall = iter([0.0, 0.001, 10.0, 10.300, 20.0, 20.300]).__next__
    cpu = iter([0.0, 0.0, 5.0, 5.299, 6.0, 6.001]).__next__
    committer = InlineSqliteCommitter(
        sqlite_url, sqlite_synchronous="FULL", max_ms=20, timer=wall, cpu_timer=cpu
    )
    try:
        group = IngestGroup()
        results = []
        for seq in range(3):
            group.cursors[("node-a", "agent-1")] = (seq, 1)
            results.append(committer.try_commit(group, None))
        # 1st: compiles the statements (not judged); 2nd: 300 ms, of which 299 ms CPU: not a
        # slow disk; 3rd: 300 ms, of which 299 ms waiting: the average is over 20 ms ...
        assert results == [True, True, True]
        group.cursors[("node-a", "agent-1")] = (3, 1)
        assert committer.try_commit(group, None) is False  # ... so the next goes to the thread
    finally:
        committer.close()
