"""Step progress (what the ledger reads to know when a job made progress again) is written by
the ingest group commit: a change acknowledged survives ``kill -9``; a change whose commit was
cut off by ``kill -9`` is written nothing of, and the agent's retry writes it once.
A real ``rlguard server`` process on SQLite."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core import migrate
from app.models import Role
from tests.harness import ServerProcess, auth, batch, rlguard_env, wait_for
from tests.harness.services import hold_write_lock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

JOB = "grpo-progress"


def _report(seq: int, step: int, ts: float) -> dict:
    return batch(
        "gpu-07",
        seq,
        n=1,
        participants=[
            {"job": JOB, "role": "trainer", "rank": r, "phase": "TRAIN", "step": step, "ts": ts}
            for r in (0, 1)
        ],
    )


def _steps(url: str) -> list[tuple[str, int, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(
                    sa.text("SELECT role, rank, step FROM step_progress ORDER BY at")
                )
            ]
    finally:
        engine.dispose()


def test_step_changes_survive_kill9_and_a_cut_off_commit_is_written_once_on_retry(
    sqlite_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    env = rlguard_env(
        sqlite_url, tmp_path / "data", RLGUARD_DEV="1", RLGUARD_INGEST__COMMIT_TIMEOUT_SECONDS="60"
    )
    # Set up in-process (each `rlguard` command costs seconds of start-up on a loaded machine).
    migrate.upgrade(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    with Session(engine) as s:
        token = create_node_token(s, node="gpu-07", actor="test")[1]
        viewer = create_user(s, name="vic", role=Role.viewer, actor="test")[1]
        s.commit()
    engine.dispose()
    server = server_factory("server", env).start()

    def post(body: dict) -> httpx.Response:
        return httpx.post(server.url + "/api/v1/ingest", json=body, headers=auth(token), timeout=30)

    t0 = time.time() - 60
    for seq, step in ((1, 4), (2, 4), (3, 5)):
        assert post(_report(seq, step, t0 + seq)).json()["duplicate"] is False
    # Rank 0 speaks for its role: one row per change, none for the repeated step 4.
    assert _steps(sqlite_url) == [("trainer", 0, 4), ("trainer", 0, 5)]

    # The bad moment: step 6 is in memory but its commit waits on a lock; kill -9 then.
    held, release = threading.Event(), threading.Event()
    locker = threading.Thread(target=hold_write_lock, args=(sqlite_url, held, release))
    locker.start()
    body = _report(5, 6, t0 + 5)
    answer: list[object] = []
    try:
        assert held.wait(10)

        def send() -> None:
            try:
                answer.append(post(body))
            except httpx.TransportError as exc:
                answer.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        # The batch's samples reach the in-memory window before its commit is awaited.
        newest = max(s["ts"] for s in body["samples"])

        def in_window() -> bool:
            r = httpx.get(
                server.url + "/api/v1/series",
                params={"node": "gpu-07", "name": "gpu_util", "since": -600},
                headers=auth(viewer),
                timeout=5,
            )
            return any(ts == newest for s in r.json()["data"] for ts, _v in s["points"])

        wait_for(in_window, 20, "the batch in the series window", interval=0.05)
        assert answer == []  # applied, waiting for its commit: not acknowledged
        server.kill9()
        sender.join(30)
        assert len(answer) == 1 and isinstance(answer[0], httpx.TransportError)
    finally:
        release.set()
        locker.join(10)
    assert _steps(sqlite_url) == [("trainer", 0, 4), ("trainer", 0, 5)]  # nothing half-written

    server.start()  # the tracker starts from the participant table: step 5 is not new
    assert post(_report(6, 5, t0 + 4)).json()["duplicate"] is False
    assert post(body).json()["duplicate"] is False  # the agent's retry
    assert post(body).json()["duplicate"] is True
    assert _steps(sqlite_url) == [("trainer", 0, 4), ("trainer", 0, 5), ("trainer", 0, 6)]
    server.stop()
