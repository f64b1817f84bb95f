"""Fault tests on PostgreSQL and Redis instances these tests start themselves.

* PostgreSQL crashes (immediate stop) and comes back while an agent-like client keeps ingesting:
  every acknowledged batch is in the database cursor and in the window exactly once, and the
  server recovers without a restart.
* Redis (the shared window of two replicas) is killed and restarted empty: ingest answers 503
  meanwhile, then resumes by itself; a batch acknowledged before the restart is still refused as a
  duplicate through the other replica (the epoch change makes replicas reload from the database).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from tests.harness import RLGUARD, ServerProcess, batch, free_port, rlguard_env, wait_for
from tests.harness.services import PostgresInstance, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

N = 3  # samples per batch


def _tokens(url: str) -> tuple[str, str]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            viewer = create_user(s, name="v", role=Role.viewer, actor="test")[1]
            node = create_node_token(s, node="n1", actor="test")[1]
            s.commit()
    finally:
        engine.dispose()
    return viewer, node


def _server(url: str, data: Path, log: Path, **env: str) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)],
        rlguard_env(
            url,
            data,
            RLGUARD_DEV="1",
            RLGUARD_INGEST__COMMIT_TIMEOUT_SECONDS="2",
            RLGUARD_POLICY_SCHEDULER="0",
            **env,
        ),
        port,
        log,
    )


def deliver(url: str, token: str, seq: int, deadline: float) -> bool:
    """As the agent does: the same seq until it is acknowledged (accepted or duplicate).
    Returns whether it was acknowledged as a duplicate."""
    while True:
        assert time.monotonic() < deadline, f"seq {seq} never acknowledged"
        try:
            r = httpx.post(
                f"{url}/api/v1/ingest",
                json=batch("n1", seq, n=N),
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
        except httpx.TransportError:
            time.sleep(0.2)  # a retrying client's back-off: the replica is restarting
            continue
        if r.status_code == 200:
            return bool(r.json()["duplicate"])
        assert r.status_code == 503, r.text  # only "not durable yet / unavailable" is allowed
        time.sleep(0.2)  # a retrying client's back-off, as the agent's


def points(url: str, viewer: str) -> int:
    r = httpx.get(
        f"{url}/api/v1/series",
        params={"node": "n1", "since": -900, "limit": 1000},
        headers={"Authorization": f"Bearer {viewer}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return sum(len(d["points"]) for d in r.json()["data"])


def cursor(url: str) -> tuple[int, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(
                sa.text("SELECT high_seq, window_mask FROM ingest_cursor WHERE node_name = 'n1'")
            ).one()
    finally:
        engine.dispose()


@pytest.fixture
def own_postgres(tmp_path: Path) -> Iterator[PostgresInstance]:
    pg = PostgresInstance(tmp_path / "pg").init()
    try:
        yield pg
    finally:
        pg.destroy()


def test_postgres_crash_during_ingest_loses_nothing_acknowledged(
    own_postgres: PostgresInstance, tmp_path: Path
) -> None:
    pg = own_postgres
    migrate.upgrade(pg.url)
    viewer, node = _tokens(pg.url)
    server = _server(pg.url, tmp_path / "data", tmp_path / "server.log")
    try:
        server.start(timeout=90)
        pid = server.proc.pid if server.proc else None
        deadline = time.monotonic() + 150
        restarted = threading.Event()

        def crash_and_restart() -> None:
            pg.stop_immediate()
            time.sleep(3)  # longer than the commit timeout: requests get 503 meanwhile
            pg.start()
            restarted.set()

        crasher: threading.Thread | None = None
        for seq in range(40):
            if seq == 15:
                crasher = threading.Thread(target=crash_and_restart)
                crasher.start()
            deliver(server.url, node, seq, deadline)
        assert crasher is not None
        crasher.join(60)
        assert restarted.is_set()
        # Every acknowledged batch is durable and in the window exactly once.
        assert cursor(pg.url) == (39, (1 << 40) - 1 & ((1 << 63) - 1))
        assert points(server.url, viewer) == 40 * N
        # A retry of a batch acknowledged before the crash is still a duplicate.
        assert deliver(server.url, node, 3, deadline) is True
        # Recovered without a restart of the server.
        assert server.proc is not None and server.proc.poll() is None and server.proc.pid == pid
        assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
        assert "ingest commit failed" in server.output()  # the outage really happened
    finally:
        server.kill9()


def test_redis_restart_under_two_replicas_with_a_shared_window(
    postgres_url: str, tmp_path: Path
) -> None:
    migrate.upgrade(postgres_url)
    viewer, node = _tokens(postgres_url)
    redis = RedisServer(tmp_path / "redis").start()
    servers = [
        _server(
            postgres_url,
            tmp_path / f"data{i}",
            tmp_path / f"server{i}.log",
            RLGUARD_REDIS_URL=redis.url,
            RLGUARD_SERIES__SHARED_WINDOW="true",
            RLGUARD_SERIES__SHARED_FOLLOW_INTERVAL_SECONDS="0.2",
        )
        for i in range(2)
    ]
    try:
        for s in servers:
            s.start(timeout=90)
        a, b = servers
        deadline = time.monotonic() + 150
        for seq in range(10):
            assert deliver((a if seq % 2 else b).url, node, seq, deadline) is False
        # Both replicas followed each other before Redis goes: what a replica had not followed
        # yet when Redis loses its data is missing from its window (a cache the agents refill)
        # until new samples arrive; the database keeps every acknowledged batch either way.
        wait_for(
            lambda: (points(a.url, viewer), points(b.url, viewer)) == (10 * N, 10 * N),
            15,
            "both windows to hold the 10 batches",
            context=lambda: str((points(a.url, viewer), points(b.url, viewer))),
        )
        redis.stop()
        r = httpx.post(
            f"{a.url}/api/v1/ingest",
            json=batch("n1", 10, n=N),
            headers={"Authorization": f"Bearer {node}"},
            timeout=10,
        )
        assert r.status_code == 503 and "Redis" in r.json()["detail"], r.text
        redis.start()  # same port, empty: every claim and the stream are gone
        for seq in range(10, 20):
            assert deliver((a if seq % 2 else b).url, node, seq, deadline) is False
        # Acknowledged before the restart, retried through the other replica: still a duplicate.
        for seq in (0, 1, 9):
            assert deliver((b if seq % 2 else a).url, node, seq, deadline) is True
        assert cursor(postgres_url) == (19, (1 << 20) - 1)
        # Both windows: the 10 batches before the restart and the 10 after, exactly once.
        wait_for(
            lambda: (points(a.url, viewer), points(b.url, viewer)) == (20 * N, 20 * N),
            15,
            "both windows to hold the 20 batches",
            context=lambda: str((points(a.url, viewer), points(b.url, viewer))),
        )
        assert all(s.proc is not None and s.proc.poll() is None for s in servers)
    finally:
        for s in servers:
            s.kill9()
        redis.stop()
