"""Phase transitions: written by the ingest group commit, once per change, across restarts and
a SIGKILL at a bad moment; read back through ``GET /api/v1/jobs/{job}/phases``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from app.models import Role
from tests.harness import (
    Api,
    ServerProcess,
    auth,
    batch,
    rlguard_env,
    run_cli,
    wait_for,
)
from tests.harness.services import hold_write_lock

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOB = "grpo-phases"


def _with_phase(node: str, seq: int, phase: str, *, ts: float, role: str = "trainer") -> dict:
    return batch(
        node,
        seq,
        n=1,
        participants=[{"job": JOB, "role": role, "rank": 0, "phase": phase, "step": seq, "ts": ts}],
    )


def _rows(url: str) -> list[tuple[str, str | None, int]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return [
                (r[0], r[1], r[2])
                for r in conn.execute(
                    sa.text("SELECT phase, previous_phase, step FROM phase_transition ORDER BY at")
                )
            ]
    finally:
        engine.dispose()


def test_only_changes_are_recorded_also_after_a_restart(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    api = make_api(migrated_url)
    token = api.node_token("node-a")
    h = auth(token)
    t0 = time.time() - 100
    for seq, phase in enumerate(["ROLLOUT", "ROLLOUT", "COLLECT", "TRAIN", "TRAIN"], start=1):
        r = api.client.post(
            "/api/v1/ingest", json=_with_phase("node-a", seq, phase, ts=t0 + seq), headers=h
        )
        assert r.status_code == 200, r.text
    # A late report (older than the newest known) is not drawn as the current phase.
    late = _with_phase("node-a", 6, "ROLLOUT", ts=t0 + 2.5)
    assert api.client.post("/api/v1/ingest", json=late, headers=h).status_code == 200
    assert _rows(migrated_url) == [
        ("ROLLOUT", None, 1),
        ("COLLECT", "ROLLOUT", 3),
        ("TRAIN", "COLLECT", 4),
    ]
    api.client.close()

    again = make_api(migrated_url)  # a restarted server: the tracker starts from the database
    h = auth(token)
    same = _with_phase("node-a", 7, "TRAIN", ts=t0 + 7)
    assert again.client.post("/api/v1/ingest", json=same, headers=h).status_code == 200
    nxt = _with_phase("node-a", 8, "EVAL", ts=t0 + 8)
    assert again.client.post("/api/v1/ingest", json=nxt, headers=h).status_code == 200
    assert _rows(migrated_url)[-2:] == [("TRAIN", "COLLECT", 4), ("EVAL", "TRAIN", 8)]

    viewer = again.user_token("vic", Role.viewer)
    r = again.client.get(f"/api/v1/jobs/{JOB}/phases", headers=auth(viewer))
    assert r.status_code == 200, r.text
    assert [t["phase"] for t in r.json()["data"]] == ["ROLLOUT", "COLLECT", "TRAIN", "EVAL"]


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


def _phases(server: ServerProcess, user_token: str, **params: object) -> httpx.Response:
    return httpx.get(
        f"{server.url}/api/v1/jobs/{JOB}/phases",
        params={"since": "2000-01-01T00:00:00Z", **params},
        headers=auth(user_token),
        timeout=10,
    )


@pytest.mark.slow
def test_a_change_survives_kill9_after_its_ack_and_is_noticed_again_if_never_acked(
    database_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    env, node_token, user_token = _prepare(database_url, tmp_path)
    server = server_factory("server", env).start()
    post = lambda body: httpx.post(  # noqa: E731
        server.url + "/api/v1/ingest", json=body, headers=auth(node_token), timeout=30
    )
    t0 = time.time() - 60
    assert post(_with_phase("gpu-07", 1, "ROLLOUT", ts=t0 + 1)).json()["duplicate"] is False
    assert post(_with_phase("gpu-07", 2, "TRAIN", ts=t0 + 2)).json()["duplicate"] is False
    server.kill9()  # right after the acknowledgement

    server.start()
    r = _phases(server, user_token)
    assert r.status_code == 200, r.text
    assert [(t["phase"], t["previous_phase"]) for t in r.json()["data"]] == [
        ("ROLLOUT", None),
        ("TRAIN", "ROLLOUT"),
    ]

    # Now the bad moment: the change is in memory (tracker, store) but its commit is blocked.
    held, release = threading.Event(), threading.Event()
    locker = threading.Thread(target=hold_write_lock, args=(database_url, held, release))
    locker.start()
    body = _with_phase("gpu-07", 3, "EVAL", ts=t0 + 3)
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
        # The batch's sample reaches the in-memory window before its commit is awaited.
        newest = max(smp["ts"] for smp in body["samples"])

        def in_window() -> bool:
            r = httpx.get(
                server.url + "/api/v1/series",
                params={"node": "gpu-07", "name": "gpu_util", "since": -600},
                headers=auth(user_token),
                timeout=5,
            )
            return any(ts == newest for sr in r.json()["data"] for ts, _v in sr["points"])

        wait_for(in_window, 20, "the batch in the series window", interval=0.05)
        assert answer == []
        server.kill9()
        sender.join(30)
        assert len(answer) == 1 and isinstance(answer[0], httpx.TransportError)
    finally:
        release.set()
        locker.join(10)
    assert [p for p, _, _ in _rows(database_url)] == ["ROLLOUT", "TRAIN"]  # nothing half-written

    server.start()
    retry = post(body)  # the agent's retry of the unacknowledged batch
    assert retry.json()["duplicate"] is False
    assert post(body).json()["duplicate"] is True
    phases = [(t["phase"], t["previous_phase"]) for t in _phases(server, user_token).json()["data"]]
    assert phases == [("ROLLOUT", None), ("TRAIN", "ROLLOUT"), ("EVAL", "TRAIN")]
    server.stop()


def test_phases_route_bad_input(migrated_url: str, make_api: Callable[..., Api]) -> None:
    api = make_api(migrated_url)
    token = api.node_token("node-a")
    r = api.client.post(
        "/api/v1/ingest",
        json=_with_phase("node-a", 1, "TRAIN", ts=time.time()),
        headers=auth(token),
    )
    assert r.status_code == 200
    viewer = auth(api.user_token("vic", Role.viewer))
    ok = api.client.get(f"/api/v1/jobs/{JOB}/phases", headers=viewer)
    assert ok.status_code == 200 and ok.json()["count"] == 1
    missing = api.client.get("/api/v1/jobs/nope/phases", headers=viewer)
    assert missing.status_code == 404 and "'nope'" in missing.json()["detail"]
    naive = api.client.get(
        f"/api/v1/jobs/{JOB}/phases", params={"since": "2026-01-01T00:00:00"}, headers=viewer
    )
    assert naive.status_code == 422 and "time zone" in naive.json()["detail"]
    future = api.client.get(
        f"/api/v1/jobs/{JOB}/phases", params={"since": "2999-01-01T00:00:00Z"}, headers=viewer
    )
    assert future.status_code == 422 and "future" in future.json()["detail"]
    garbage = api.client.get(f"/api/v1/jobs/{JOB}/phases", params={"since": "soon"}, headers=viewer)
    assert garbage.status_code == 422
    too_many = api.client.get(f"/api/v1/jobs/{JOB}/phases", params={"limit": 0}, headers=viewer)
    assert too_many.status_code == 422
    assert api.client.get(f"/api/v1/jobs/{JOB}/phases").status_code == 401
