"""Durability of ingest dedupe across a real server process being killed with SIGKILL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.harness import ServerProcess, auth, batch, rlguard_env, run_cli, wait_for
from tests.harness.services import hold_write_lock

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


def _prepare(database_url: str, tmp_path: Path) -> tuple[dict[str, str], str, str]:
    env = rlguard_env(
        database_url,
        tmp_path / "data",
        RLGUARD_DEV="1",
        RLGUARD_INGEST__COMMIT_TIMEOUT_SECONDS="60",
    )
    assert run_cli("db", "upgrade", env=env).returncode == 0
    node_token = run_cli("token", "create", "--node", "gpu-07", env=env).stdout.strip()
    user_token = run_cli("user", "create", "vic", "--role", "viewer", env=env).stdout.strip()
    return env, node_token, user_token


def _points(server: ServerProcess, user_token: str) -> list[float]:
    r = httpx.get(
        server.url + "/api/v1/series",
        params={"node": "gpu-07", "since": 0},
        headers=auth(user_token),
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return sorted(v for s in r.json()["data"] for _ts, v in s["points"])


def test_acknowledged_batch_is_a_duplicate_after_kill9_and_restart(
    database_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    env, node_token, user_token = _prepare(database_url, tmp_path)
    server = server_factory("server", env).start()
    first = batch("gpu-07", 41, n=5)
    r = httpx.post(server.url + "/api/v1/ingest", json=first, headers=auth(node_token), timeout=10)
    assert r.json() == {"accepted": 5, "duplicate": False}
    server.kill9()  # right after the acknowledgement: no graceful shutdown, no flush

    server.start()
    again = httpx.post(
        server.url + "/api/v1/ingest", json=first, headers=auth(node_token), timeout=10
    )
    assert again.status_code == 200
    assert again.json() == {"accepted": 0, "duplicate": True}
    assert _points(server, user_token) == []  # the replay was not applied a second time
    nxt = batch("gpu-07", 42, n=2)
    r = httpx.post(server.url + "/api/v1/ingest", json=nxt, headers=auth(node_token), timeout=10)
    assert r.json() == {"accepted": 2, "duplicate": False}
    assert _points(server, user_token) == [0.0, 1.0]
    server.stop()


def test_unacknowledged_batch_is_applied_once_after_kill9(
    database_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    """Killed after the batch reached the series store but before its commit: never acked, so
    the agent's retry must be applied (once) by the restarted server."""
    env, node_token, user_token = _prepare(database_url, tmp_path)
    server = server_factory("server", env).start()
    held, release = threading.Event(), threading.Event()
    locker = threading.Thread(target=hold_write_lock, args=(database_url, held, release))
    locker.start()
    try:
        assert held.wait(10)
        body = batch("gpu-07", 7, n=3)
        answer: list[object] = []

        def send() -> None:
            try:
                answer.append(
                    httpx.post(
                        server.url + "/api/v1/ingest",
                        json=body,
                        headers=auth(node_token),
                        timeout=30,
                    )
                )
            except httpx.TransportError as exc:
                answer.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        # the batch is in the store (visible through the API) but its commit is blocked
        wait_for(
            lambda: _points(server, user_token) == [0.0, 1.0, 2.0],
            30,
            "the batch in the series store",
            interval=0.05,
        )
        assert answer == []  # not acknowledged
        server.kill9()
        sender.join(30)
        assert len(answer) == 1 and isinstance(answer[0], httpx.TransportError)
    finally:
        release.set()
        locker.join(10)
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM ingest_cursor")).scalar() == 0
    engine.dispose()

    server.start()
    retry = httpx.post(
        server.url + "/api/v1/ingest", json=body, headers=auth(node_token), timeout=10
    )
    assert retry.json() == {"accepted": 3, "duplicate": False}
    again = httpx.post(
        server.url + "/api/v1/ingest", json=body, headers=auth(node_token), timeout=10
    )
    assert again.json() == {"accepted": 0, "duplicate": True}
    assert _points(server, user_token) == [0.0, 1.0, 2.0]
    server.stop()
