"""synchronous=FULL with inline commits (app.ingest.commit.sqlite_loop): the commit runs on the loop without
an fsync, the WAL is fsynced on a thread, and no request of the group is answered before that
fsync returned; a failed fsync leaves the group unacknowledged and it is committed again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.core import migrate
from app.ingest.commit.sqlite_loop import fsync_path
from app.models import IngestCursor
from tests.harness import Api, auth, batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def sqlite_api(sqlite_url: str, make_api: Callable[..., Api]) -> Api:
    migrate.upgrade(sqlite_url)
    return make_api(sqlite_url, ingest={"commit_timeout_seconds": 20})  # FULL: the default


def _high_seq(api: Api) -> int | None:
    t = IngestCursor.__table__  # type: ignore[attr-defined]
    with api.engine.connect() as conn:
        return conn.execute(sa.select(t.c.high_seq)).scalar_one_or_none()


def test_no_answer_before_the_wal_is_fsynced_and_the_loop_runs_meanwhile(
    sqlite_api: Api, sqlite_url: str
) -> None:
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    assert inline.syncs_wal
    with inline.engine.connect() as conn:  # the inline connection itself commits without fsync
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 1  # NORMAL
    synced: list[str] = []
    release = threading.Event()

    def slow_disk(path: str) -> None:
        synced.append(path)
        assert release.wait(30)
        fsync_path(path)  # the real one, once released

    inline.fsync = slow_disk
    token = sqlite_api.node_token("node-a")
    result: dict[str, object] = {}

    def send() -> None:
        result["response"] = sqlite_api.client.post(
            "/api/v1/ingest", json=batch("node-a", 0, n=4), headers=auth(token)
        )

    sender = threading.Thread(target=send)
    sender.start()
    try:
        wait_for(lambda: synced, timeout=20, what="the WAL fsync to start")
        assert _high_seq(sqlite_api) == 0  # committed (visible) ...
        assert sqlite_api.client.get("/healthz").status_code == 200  # the loop is free
        assert "response" not in result  # ... but not acknowledged before it is durable
    finally:
        release.set()
    sender.join(30)
    assert result["response"].json() == {"accepted": 4, "duplicate": False}  # type: ignore[attr-defined]
    assert synced == [sqlite_url.removeprefix("sqlite:///") + "-wal"]
    assert Path(synced[0]).exists()


def test_a_failed_fsync_is_not_acknowledged_and_the_group_is_committed_again(
    sqlite_api: Api,
) -> None:
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    calls: list[str] = []

    def failing_once(path: str) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise OSError(5, "Input/output error")
        fsync_path(path)

    inline.fsync = failing_once
    token = sqlite_api.node_token("node-a")
    r = sqlite_api.client.post("/api/v1/ingest", json=batch("node-a", 3, n=4), headers=auth(token))
    # answered only after the retry's fsync succeeded (the commit loop retries after 0.2 s)
    assert r.status_code == 200 and r.json() == {"accepted": 4, "duplicate": False}
    assert len(calls) == 2
    assert _high_seq(sqlite_api) == 3
    again = sqlite_api.client.post(
        "/api/v1/ingest", json=batch("node-a", 3, n=4), headers=auth(token)
    )
    assert again.json() == {"accepted": 0, "duplicate": True}


def test_the_real_fsync_runs_on_a_native_thread_and_the_batch_is_durable_when_answered(
    sqlite_api: Api, sqlite_url: str
) -> None:
    inline = sqlite_api.app.state.ingest.committer.inline  # type: ignore[attr-defined]
    assert inline.fsync is fsync_path  # nothing injected: the production path
    token = sqlite_api.node_token("node-a")
    for seq in range(3):
        r = sqlite_api.client.post(
            "/api/v1/ingest", json=batch("node-a", seq, n=4), headers=auth(token)
        )
        assert r.json() == {"accepted": 4, "duplicate": False}
        assert _high_seq(sqlite_api) == seq
    assert inline.native_syncs >= 3  # one per group, each group answered after its own
    assert inline.native_syncs == inline.inline_commits
