"""Node tokens scoped to job-name patterns, on a real server process (SQLite and PostgreSQL),
the tokens made by the real CLI and the API: a batch naming a job outside the scope is refused
403 naming the job and nothing of it is stored (no job, participant, cursor or series; its seq
is not spent); an unscoped token reports any job, as before; rotation keeps the scope."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.harness import ServerProcess, auth, batch, rlguard_env, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


def participant(job: str) -> dict[str, Any]:
    return {
        "job": job,
        "role": "trainer",
        "rank": 0,
        "phase": "TRAIN",
        "step": 3,
        "ts": time.time(),
    }


def job_sample(job: str) -> dict[str, Any]:
    labels = {"job": job, "role": "rollout", "rank": "0"}
    return {"name": "rollout_pending_ratio", "value": 0.05, "ts": time.time(), "labels": labels}


def rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with sa.create_engine(url).connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(query))]


def stored(url: str) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "jobs": rows(url, "SELECT name FROM job ORDER BY name"),
        "participants": rows(url, "SELECT job_name, role FROM participant ORDER BY job_name"),
        "cursors": rows(url, "SELECT node_name, high_seq FROM ingest_cursor ORDER BY node_name"),
    }


def test_a_scoped_token_reports_only_its_jobs(
    database_url: str, tmp_path: Path, server_factory: Callable[..., ServerProcess]
) -> None:
    env = rlguard_env(database_url, tmp_path / "data", RLGUARD_DEV="1")
    assert run_cli("db", "upgrade", env=env).returncode == 0
    made = run_cli("token", "create", "--node", "n1", "--jobs", "team-a-*,shared-eval", env=env)
    assert made.returncode == 0, made.stderr
    scoped = made.stdout.strip()
    unscoped = run_cli("token", "create", "--node", "n2", env=env).stdout.strip()
    bad = run_cli("token", "create", "--node", "n3", "--jobs", "team a", env=env)
    assert bad.returncode == 2 and "job pattern 'team a'" in bad.stderr, bad.stderr
    listed = run_cli("token", "list", env=env).stdout.splitlines()
    assert [ln.split("\t")[2:] for ln in listed if "\tnode:" in ln] == [
        ["node:n1", f"{scoped[:10]}…", "jobs:team-a-*,shared-eval", "active"],
        ["node:n2", f"{unscoped[:10]}…", "jobs:any", "active"],
    ]  # the refused token was not made, nor its node
    assert rows(database_url, "SELECT name FROM node ORDER BY name") == [("n1",), ("n2",)]
    admin = run_cli("user", "create", "root", "--role", "admin", env=env).stdout.strip()

    server = server_factory("server", env).start()
    http = httpx.Client(base_url=server.url, timeout=10)
    try:

        def ingest(token: str, body: dict[str, Any]) -> httpx.Response:
            return http.post("/api/v1/ingest", json=body, headers=auth(token))

        outside = batch("n1", 5, participants=[participant("team-a-1"), participant("team-b-1")])
        r = ingest(scoped, outside)
        assert r.status_code == 403, r.text
        assert "job 'team-b-1' is outside this node token's job scope" in r.json()["detail"]
        by_label = batch("n1", 5, participants=[participant("team-a-1")])
        by_label["samples"].append(job_sample("team-c-1"))
        r = ingest(scoped, by_label)
        assert r.status_code == 403 and "'team-c-1'" in r.json()["detail"], r.text
        assert stored(database_url) == {"jobs": [], "participants": [], "cursors": []}
        series = http.get("/api/v1/series", params={"node": "n1", "since": 0}, headers=auth(admin))
        assert series.status_code == 200 and series.json()["data"] == []

        # The same seq, now inside the scope: applied, not a duplicate (the refusals spent nothing).
        inside = batch("n1", 5, participants=[participant("team-a-1"), participant("shared-eval")])
        inside["samples"].append(job_sample("team-a-1"))
        r = ingest(scoped, inside)
        assert r.status_code == 200 and r.json()["duplicate"] is False, r.text
        r = ingest(unscoped, batch("n2", 0, participants=[participant("team-b-1")]))
        assert r.status_code == 200, r.text
        assert stored(database_url) == {
            "jobs": [("shared-eval",), ("team-a-1",), ("team-b-1",)],
            "participants": [
                ("shared-eval", "trainer"),
                ("team-a-1", "trainer"),
                ("team-b-1", "trainer"),
            ],
            "cursors": [("n1", 5), ("n2", 0)],
        }

        # The API: the scope is shown, a bad pattern is refused by name, rotation keeps it.
        tokens = http.get("/api/v1/tokens", headers=auth(admin)).json()
        assert {t["node"]: t["jobs"] for t in tokens if t["node"]} == {
            "n1": ["team-a-*", "shared-eval"],
            "n2": None,
        }
        refused = http.post(
            "/api/v1/tokens", json={"node": "n4", "jobs": ["team-*", "../x"]}, headers=auth(admin)
        )
        assert refused.status_code == 422 and "job pattern '../x'" in refused.json()["detail"]
        assert rows(database_url, "SELECT count(*) FROM api_token WHERE node_name = 'n4'") == [(0,)]
        made_api = http.post(
            "/api/v1/tokens", json={"node": "n4", "jobs": ["team-d-?"]}, headers=auth(admin)
        )
        assert made_api.status_code == 201 and made_api.json()["info"]["jobs"] == ["team-d-?"]
        n1_id = next(t["id"] for t in tokens if t["node"] == "n1")
        rotated = http.post(f"/api/v1/tokens/{n1_id}/rotate", headers=auth(admin))
        assert rotated.status_code == 201 and rotated.json()["info"]["jobs"] == [
            "team-a-*",
            "shared-eval",
        ]
        r = ingest(rotated.json()["token"], batch("n1", 6, participants=[participant("team-b-2")]))
        assert r.status_code == 403 and "'team-b-2'" in r.json()["detail"], r.text
    finally:
        http.close()
        server.stop()
