"""Two real `rlguard server` replicas on one PostgreSQL with the shared window in Redis.

Any replica takes any batch; a retry through the other replica is a duplicate (never applied
twice); every replica's window holds every replica's samples; the dedupe cursor in the database
is the union of what both committed. Then the lease-holding replica is kill -9ed and the other
takes the scheduler over within the lease time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.auth.users import create_user
from app.core import migrate
from app.core.db import make_engine
from app.models import Role
from app.series.backend import forget_shared_window, key_prefix
from tests.harness import RLGUARD, ServerProcess, batch, free_port, rlguard_env, wait_for

LEASE_S = 3.0

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def replicas(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> Iterator[tuple[list[ServerProcess], str, str, str]]:
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    with Session(engine) as s:
        viewer = create_user(s, name="v", role=Role.viewer, actor="test")[1]
        node = create_node_token(s, node="n1", actor="test")[1]
        s.commit()
    engine.dispose()
    servers: list[ServerProcess] = []
    try:
        for i in range(2):
            port = free_port()
            env = rlguard_env(
                postgres_url,
                tmp_path / f"data{i}",
                RLGUARD_DEV="1",
                RLGUARD_REDIS_URL=redis_url,
                RLGUARD_SERIES__SHARED_WINDOW="true",
                RLGUARD_SERIES__SHARED_FOLLOW_INTERVAL_SECONDS="0.2",
                RLGUARD_RECOVERY_LEASE_SECONDS=str(LEASE_S),
            )
            s = ServerProcess(
                [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)],
                env,
                port,
                tmp_path / f"server{i}.log",
            )
            servers.append(s)
            s.start(timeout=90)
        yield servers, viewer, node, postgres_url
        client = redis.Redis.from_url(redis_url)
        try:  # the deployment really used the shared window
            assert client.exists(key_prefix(postgres_url) + ":dedupe:epoch")
        finally:
            client.close()
    finally:
        for s in servers:
            s.kill9()
        forget_shared_window(redis_url, postgres_url)


def _post(server: ServerProcess, token: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/v1/ingest",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=15,
    )


def _points(server: ServerProcess, token: str) -> int:
    r = httpx.get(
        f"{server.url}/api/v1/series",
        params={"node": "n1", "since": -600},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return sum(len(d["points"]) for d in r.json()["data"])


def _lease(url: str) -> tuple[str, int] | None:
    engine = make_engine(url)
    try:
        with engine.connect() as c:
            row = c.execute(
                sa.text(
                    "SELECT holder, fencing_token FROM scheduler_lease WHERE expires_at > now()"
                )
            ).first()
    finally:
        engine.dispose()
    return None if row is None else (row[0], row[1])


def test_any_replica_takes_ingest_and_a_retry_elsewhere_is_a_duplicate(replicas) -> None:  # type: ignore[no-untyped-def]
    servers, viewer, node, db = replicas
    a, b = servers
    n = 3  # samples per batch
    for seq in range(10):
        first, other = (a, b) if seq % 2 == 0 else (b, a)
        r = _post(first, node, batch("n1", seq, n=n))
        assert r.status_code == 200 and r.json() == {"accepted": n, "duplicate": False}, r.text
        retry = _post(other, node, batch("n1", seq, n=n))
        assert retry.status_code == 200 and retry.json() == {"accepted": 0, "duplicate": True}, (
            seq,
            retry.text,
        )
    # Every replica's window has every replica's samples, each exactly once.
    wait_for(
        lambda: (_points(a, viewer), _points(b, viewer)) == (10 * n, 10 * n),
        10,
        "every replica's window to hold every sample",
        context=lambda: str((_points(a, viewer), _points(b, viewer))),
    )
    engine = make_engine(db)
    try:
        with engine.connect() as c:
            high, mask = c.execute(
                sa.text("SELECT high_seq, window_mask FROM ingest_cursor WHERE node_name = 'n1'")
            ).one()
    finally:
        engine.dispose()
    assert (high, mask) == (9, (1 << 10) - 1)  # both replicas' commits merged, none lost


def test_lease_holder_killed_the_other_replica_takes_over_within_the_lease(replicas) -> None:  # type: ignore[no-untyped-def]
    servers, _viewer, _node, db = replicas
    holder, fencing = wait_for(lambda: _lease(db), 20, "a replica to take the scheduler lease")
    pids = [s.proc.pid for s in servers if s.proc is not None]
    victim = next(s for s in servers if s.proc is not None and f":{s.proc.pid}:" in holder)
    survivor = next(s for s in servers if s is not victim)
    assert len(pids) == 2
    victim.kill9()
    killed_at = time.monotonic()
    lease = wait_for(
        lambda: (got := _lease(db)) is not None and got[0] != holder and got,
        LEASE_S + 5,
        "the other replica to take the lease over",
        interval=0.05,
    )
    failover = time.monotonic() - killed_at
    print(f"scheduler failover after kill -9: {failover:.2f} s (lease {LEASE_S} s)")  # noqa: T201
    assert survivor.proc is not None and f":{survivor.proc.pid}:" in lease[0]
    assert lease[1] == fencing + 1  # a new fencing token: the dead holder's writes are fenced
    assert failover <= LEASE_S + 2.0
