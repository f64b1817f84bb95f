"""Guard-rails through the REST API on SQLite and PostgreSQL: a job's switches, breakers, roles,
bad input refused with nothing stored, and state that outlives the app (a restart) and is
shared by a second app on the same database (a replica)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.models import Role
from app.models.guardrails import CircuitBreaker
from app.models.incident import Incident
from tests.harness import Api, auth, batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def known_job(api: Api, job: str) -> None:
    part = {
        "job": job,
        "role": "rollout",
        "rank": 0,
        "phase": "ROLLOUT",
        "step": 1,
        "ts": time.time(),
    }
    r = api.client.post(
        "/api/v1/ingest",
        json=batch("n1", 0, agent=f"a-{job}", participants=[part]),
        headers=auth(api.node_token("n1")),
    )
    assert r.status_code == 200, r.text


def put(api: Api, path: str, token: str, body: Any) -> Any:
    return api.client.request("PUT", path, json=body, headers=auth(token))


def audit_count(api: Api, action: str) -> int:
    with Session(api.engine) as s:
        return s.execute(
            sa.text("SELECT count(*) FROM audit_event WHERE action = :a"), {"a": action}
        ).scalar_one()


def test_job_automation_switches_roles_bad_input_and_a_restart(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    api = make_api(migrated_url)
    known_job(api, "grpo-1")
    viewer, op, appr = (
        api.user_token(n, r)
        for n, r in (("v", Role.viewer), ("o", Role.operator), ("a", Role.approver))
    )
    path = "/api/v1/jobs/grpo-1/automation"
    got = api.client.get(path, headers=auth(viewer))
    assert got.status_code == 200
    assert got.json() | {"updated_at": None} == {
        "job": "grpo-1",
        "dry_run": False,
        "hands_off": False,
        "updated_at": None,
        "updated_by": "",
    }
    # bad input: 422 naming the reason, nothing stored, nothing audited
    for body, words in [
        ({"dry_run": "flase"}, "dry_run"),
        ({"dry_run": True, "hands_of": True}, "hands_of"),
        ({}, "nothing to change"),
        ({"hands_off": None}, "nothing to change"),
        ({"dry_run": True, "reason": "x" * 501}, "reason"),
    ]:
        r = put(api, path, op, body)
        assert r.status_code == 422 and words in r.text, (body, r.status_code, r.text)
    assert put(api, "/api/v1/jobs/nope/automation", op, {"dry_run": True}).status_code == 404
    assert put(api, path, viewer, {"dry_run": True}).status_code == 403
    forbidden = put(api, path, op, {"dry_run": True, "hands_off": True})
    assert (
        forbidden.status_code == 403
        and "hands_off needs the approver role" in forbidden.json()["detail"]
    )
    assert api.client.get(path, headers=auth(viewer)).json()["dry_run"] is False  # nothing stored
    assert audit_count(api, "job.automation") == 0
    ok = put(api, path, op, {"dry_run": True, "reason": "first week"})
    assert (
        ok.status_code == 200
        and ok.json()["dry_run"] is True
        and ok.json()["updated_by"] == "user:o"
    )
    assert put(api, path, appr, {"hands_off": True}).json() | {"updated_at": None} == {
        "job": "grpo-1",
        "dry_run": True,
        "hands_off": True,
        "updated_at": None,
        "updated_by": "user:a",
    }
    assert audit_count(api, "job.automation") == 2
    # a second app on the database (a replica, or the server after a restart) sees the switches
    api.client.close()
    again = make_api(migrated_url)
    r = again.client.get(path, headers=auth(viewer))
    assert (r.json()["dry_run"], r.json()["hands_off"]) == (True, True)


def test_breakers_list_reset_by_an_approver_and_survive_a_restart(
    migrated_url: str, make_api: Callable[..., Api]
) -> None:
    api = make_api(migrated_url)
    viewer, op, appr = (
        api.user_token(n, r)
        for n, r in (("v", Role.viewer), ("o", Role.operator), ("a", Role.approver))
    )
    assert api.client.get("/api/v1/breakers", headers=auth(viewer)).json() == []
    with Session(api.engine) as s:
        inc = Incident(key="k", kind="heartbeat_lost", tier="heavy", job="grpo-1")
        s.add(inc)
        s.flush()
        s.add(
            CircuitBreaker(
                scope="job:grpo-1",
                open=True,
                reason="21 automatic actions in 10 min (limit 20)",
                incident_id=inc.id,
                trips=1,
            )
        )
        s.add(CircuitBreaker(scope="cluster", open=False, reason="old", trips=2))
        s.commit()
    api.client.close()
    api = make_api(
        migrated_url
    )  # the breaker is in the database: a restarted server still sees it open
    listed = api.client.get("/api/v1/breakers", headers=auth(viewer)).json()
    assert [(b["scope"], b["open"], b["trips"]) for b in listed] == [
        ("job:grpo-1", True, 1),
        ("cluster", False, 2),
    ]
    reset = "/api/v1/breakers/job:grpo-1/reset"
    assert api.client.post(reset, headers=auth(op)).status_code == 403  # approvers reset breakers
    bad = api.client.post("/api/v1/breakers/job:a b/reset", headers=auth(appr))
    assert bad.status_code == 422 and "'job:a b'" in bad.json()["detail"]
    bad = api.client.post(reset, json={"comment": "ok", "force": True}, headers=auth(appr))
    assert bad.status_code == 422 and "force" in bad.text
    assert (
        api.client.post("/api/v1/breakers/job:other/reset", headers=auth(appr)).status_code == 404
    )
    assert api.client.post("/api/v1/breakers/cluster/reset", headers=auth(appr)).status_code == 409
    assert audit_count(api, "breaker.reset") == 0
    ok = api.client.post(reset, json={"comment": "image fixed"}, headers=auth(appr))
    assert (
        ok.status_code == 200 and ok.json()["open"] is False and ok.json()["reset_by"] == "user:a"
    )
    assert audit_count(api, "breaker.reset") == 1
    listed = api.client.get("/api/v1/breakers", headers=auth(viewer)).json()
    assert [b["open"] for b in listed] == [False, False]
    # The incident that says why it tripped says who closed it.
    [inc_id] = [b["incident_id"] for b in listed if b["scope"] == "job:grpo-1"]
    got = api.client.get(f"/api/v1/incidents/{inc_id}", headers=auth(viewer))
    assert got.status_code == 200, got.text
    timeline = got.json()["timeline"]
    [entry] = [e for e in timeline if e["type"] == "breaker_reset"]
    assert entry["actor"] == "user:a" and entry["detail"]["comment"] == "image fixed"
