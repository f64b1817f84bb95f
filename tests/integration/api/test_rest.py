"""REST API: nodes, jobs, series, tokens, users, login, roles, audit rows, health probes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from sqlmodel import Session, select

from app.models import AuditEvent, Role
from tests.harness import Api, auth, batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def audit_rows(api: Api) -> list[tuple[str, str, str]]:
    with Session(api.engine) as s:
        return [
            (e.actor, e.action, e.target)
            for e in s.exec(select(AuditEvent).order_by(AuditEvent.id)).all()
        ]


def test_read_endpoints(api: Api) -> None:
    node_token = api.node_token("node-a")
    viewer = api.user_token("vera", Role.viewer)
    now = time.time()
    body = batch(
        "node-a",
        0,
        n=4,
        participants=[
            {
                "job": "job-1",
                "role": "trainer",
                "rank": 0,
                "phase": "TRAIN",
                "step": 3,
                "ts": now - 2,
            },
            {
                "job": "job-1",
                "role": "rollout",
                "rank": 0,
                "phase": "ROLLOUT",
                "step": 3,
                "ts": now - 20,
            },
            {
                "job": "job-1",
                "role": "rollout",
                "rank": 1,
                "phase": "ROLLOUT",
                "step": 3,
                "ts": now,
            },
        ],
        fingerprint={"torch": "2.13.0"},
    )
    assert api.client.post("/api/v1/ingest", json=body, headers=auth(node_token)).status_code == 200
    h = auth(viewer)

    nodes = api.client.get("/api/v1/nodes", headers=h).json()
    assert nodes["count"] == 1
    (n,) = nodes["data"]
    assert n["name"] == "node-a" and n["series"] == 2 and n["last_agent_id"] == "agent-1"
    assert 0 <= n["last_seen_age_seconds"] < 30

    detail = api.client.get("/api/v1/nodes/node-a", headers=h).json()
    assert detail["fingerprint"] == {"torch": "2.13.0"}
    assert [(s["name"], s["labels"], s["value"]) for s in detail["latest"]] == [
        ("gpu_util", {"gpu": "0"}, 2.0),
        ("gpu_util", {"gpu": "1"}, 3.0),
    ]
    assert len(detail["participants"]) == 3
    assert api.client.get("/api/v1/nodes/nope", headers=h).status_code == 404

    jobs = api.client.get("/api/v1/jobs", headers=h).json()
    assert jobs["data"][0]["name"] == "job-1"
    assert jobs["data"][0]["phases"] == {"TRAIN": 1, "ROLLOUT": 2}
    job = api.client.get("/api/v1/jobs/job-1", headers=h).json()
    ages = {(p["role"], p["rank"]): p["heartbeat_age_seconds"] for p in job["participant_list"]}
    assert 19 <= ages[("rollout", 0)] < 60
    assert ages[("rollout", 1)] < 15
    assert api.client.get("/api/v1/jobs/nope", headers=h).status_code == 404

    series = api.client.get(
        "/api/v1/series", params={"node": "node-a", "name": "gpu_util", "since": 0}, headers=h
    ).json()
    assert series["count"] == 2 and not series["truncated"]
    assert sorted(v for s in series["data"] for _, v in s["points"]) == [0.0, 1.0, 2.0, 3.0]
    # Relative since: the samples are 4..1 s older than the batch; "the last 2.5 s" of the batch
    # is 2.5 s plus however long the machine took to get here.
    back = 2.5 + (time.time() - body["sent_at"])
    recent = api.client.get(
        "/api/v1/series", params={"node": "node-a", "since": -back}, headers=h
    ).json()
    assert sorted(v for s in recent["data"] for _, v in s["points"]) == [2.0, 3.0]
    limited = api.client.get(
        "/api/v1/series", params={"node": "node-a", "since": 0, "limit": 1}, headers=h
    ).json()
    assert limited["count"] == 1 and limited["truncated"]
    bad = api.client.get("/api/v1/series", headers=h)
    assert bad.status_code == 422 and "node=" in bad.json()["detail"]
    bad = api.client.get(
        "/api/v1/series", params={"node": "node-a", "since": "yesterday"}, headers=h
    )
    assert bad.status_code == 422
    metrics = api.client.get("/metrics").text
    # latency by route template (never the raw path), method and status
    assert (
        'rlguard_http_request_duration_seconds_count{method="GET",route="/api/v1/nodes/{node}",status="404"} 1.0'
        in metrics
    )
    assert 'route="/api/v1/nodes/nope"' not in metrics


def test_health_and_ready(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"status": "ok", "database": "ok", "ingest": "ok"}
    ingest = api.app.state.ingest  # type: ignore[attr-defined]
    assert ingest.committer_alive()
    api.client._portal.call(ingest.stop)  # what a dead committer looks like to a probe
    r = api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["ingest"] == "committer stopped"


def test_readyz_is_503_when_the_database_is_unreachable(make_api, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from app.core import migrate

    url = f"sqlite:///{tmp_path / 'gone' / 'x.db'}"
    migrate.upgrade(url)
    api = make_api(url)
    (tmp_path / "gone" / "x.db").unlink()
    for extra in ("-wal", "-shm"):
        (tmp_path / "gone" / f"x.db{extra}").unlink(missing_ok=True)
    (tmp_path / "gone").rmdir()
    api.engine.dispose()
    r = api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"


def test_roles_are_ordered_and_enforced(api: Api) -> None:
    tokens = {role: api.user_token(f"u-{role.value}", role) for role in Role}
    for role, token in tokens.items():
        assert api.client.get("/api/v1/nodes", headers=auth(token)).status_code == 200
        me = api.client.get("/api/v1/me", headers=auth(token)).json()
        assert me["role"] == role.value
        admin_only = api.client.get("/api/v1/users", headers=auth(token))
        if role is Role.admin:
            assert admin_only.status_code == 200
        else:
            assert admin_only.status_code == 403
            assert "admin role" in admin_only.json()["detail"]
    assert api.client.get("/api/v1/nodes").status_code == 401
    assert api.client.get("/api/v1/nodes", headers=auth("rlgu_nope")).status_code == 401
    node_token = api.node_token("node-z")
    assert api.client.get("/api/v1/nodes", headers=auth(node_token)).status_code == 401
    assert Role.approver.allows(Role.operator) and not Role.operator.allows(Role.approver)


def test_state_changes_are_audited(api: Api) -> None:
    admin = api.user_token("adam", Role.admin)
    start = len(audit_rows(api))
    h = auth(admin)
    r = api.client.post(
        "/api/v1/tokens", json={"node": "node-q", "description": "rack 3"}, headers=h
    )
    assert r.status_code == 201
    token_id = r.json()["info"]["id"]
    assert r.json()["token"].startswith("rlgn_")
    listed = api.client.get("/api/v1/tokens", headers=h).json()
    assert all("token" not in t and "token_hash" not in t for t in listed)
    assert (
        api.client.delete(f"/api/v1/tokens/{token_id}", headers=h).json()["revoked_at"] is not None
    )
    assert api.client.delete("/api/v1/tokens/99999", headers=h).status_code == 404
    r = api.client.post(
        "/api/v1/users",
        json={"name": "pia", "role": "approver", "password": "s3cret-pass"},
        headers=h,
    )
    assert r.status_code == 201 and r.json()["user"]["role"] == "approver"
    assert (
        api.client.post(
            "/api/v1/users", json={"name": "pia", "role": "viewer"}, headers=h
        ).status_code
        == 409
    )
    bad = api.client.post("/api/v1/users", json={"name": "x y", "role": "viewer"}, headers=h)
    assert bad.status_code == 422 and "'x y'" in bad.json()["detail"]
    bad = api.client.post("/api/v1/users", json={"name": "zed", "role": "god"}, headers=h)
    assert bad.status_code == 422
    bad = api.client.post("/api/v1/tokens", json={"node": "bad node"}, headers=h)
    assert bad.status_code == 422 and "'bad node'" in bad.json()["detail"]
    login = api.client.post("/api/v1/auth/token", json={"name": "pia", "password": "s3cret-pass"})
    assert login.status_code == 201
    assert api.client.get("/api/v1/me", headers=auth(login.json()["token"])).json()["name"] == "pia"
    wrong = api.client.post("/api/v1/auth/token", json={"name": "pia", "password": "nope-nope"})
    assert wrong.status_code == 401

    rows = audit_rows(api)[start:]
    assert ("user:adam", "node.register", "node-q") in rows
    assert ("user:adam", "token.create", "node:node-q") in rows
    assert ("user:adam", "token.revoke", f"token:{token_id}") in rows
    assert ("user:adam", "user.create", "user:pia") in rows
    assert ("user:pia", "auth.login", "user:pia") in rows
    # refused calls changed nothing and wrote no audit row
    assert not any(t in ("user:x y", "user:zed", "node:bad node") for _a, _b, t in rows)
    # the audit log is readable by admins through the API
    audit = api.client.get("/api/v1/audit", headers=h).json()
    assert audit[0]["action"] == "auth.login"
    non_admin = api.user_token("vic", Role.viewer)
    assert api.client.get("/api/v1/audit", headers=auth(non_admin)).status_code == 403


def test_openapi_documents_the_ingest_body(api: Api) -> None:
    spec = api.client.get("/openapi.json").json()
    paths = spec["paths"]
    for p in (
        "/api/v1/ingest",
        "/api/v1/nodes",
        "/api/v1/nodes/{node}",
        "/api/v1/jobs",
        "/api/v1/jobs/{job}",
        "/api/v1/series",
        "/healthz",
        "/readyz",
    ):
        assert p in paths, p
    body = paths["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/IngestBatch"}
    sample = spec["components"]["schemas"]["Sample"]
    assert sample["properties"]["name"]["pattern"] == "^[a-zA-Z_:][a-zA-Z0-9_:]*$"
    assert "/bench/baseline-ingest" not in paths


def test_bench_endpoints_exist_only_where_turned_on(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    plain = make_api(migrated_url)
    for path in ("/bench/baseline-ingest", "/bench/forget-baseline"):
        assert plain.client.post(path, content=b"{}").status_code == 404, path
    bench = make_api(migrated_url, bench_endpoints=True)
    body = b'{"samples": [{"name": "x"}]}'
    assert bench.client.post("/bench/baseline-ingest", content=body).json()["accepted"] == 1
    assert bench.client.post("/bench/forget-baseline").status_code == 204
