"""Audit completeness: every state-changing route of the real app writes an AuditEvent.

The list of state-changing routes is read from the app itself, so a new POST/PUT/PATCH/DELETE
route without a case here fails ``test_every_state_changing_route_has_a_case``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.alerts.config import parse_alerts_config
from app.auth.users import create_user
from app.core import migrate
from app.main import create_app
from app.models import Role
from app.models.guardrails import CircuitBreaker
from tests.harness import Api, AppClient, auth, batch, free_port, make_settings
from tests.harness.dashboard import PASSWORD, DashboardApp, csrf_from, seed_heavy_incident
from tests.integration.silences.test_alertmanager_v2_api import NODE_N1
from tests.integration.silences.test_alertmanager_v2_api import am_silence as _am_silence


def am_silence() -> dict[str, Any]:
    """A silence in Alertmanager's ``postableSilence`` shape, on a node nothing reports."""
    return _am_silence({**NODE_N1, "value": "n9"}, comment="audit")


pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Ingest is telemetry at one request per node per second: its durable record is the per-agent
# dedupe cursor written with every batch, not an audit row per batch (docs/api.md).
NOT_AUDITED = {("POST", "/api/v1/ingest")}


def state_changing_routes(app: Any) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()

    def walk(routes: list[Any], prefix: str) -> None:
        for r in routes:
            if hasattr(r, "original_router"):  # FastAPI's lazily included router
                walk(r.original_router.routes, prefix + r.include_context.prefix)
            elif getattr(r, "methods", None):
                for m in set(r.methods) - {"GET", "HEAD", "OPTIONS"}:
                    found.add((m, prefix + r.path))

    walk(app.routes, "")
    return found


@pytest.fixture
def full_api(postgres_url: str, redis_url: str, tmp_path: Path) -> Iterator[Api]:
    """The app with every lifespan (the policy scheduler takes Alertmanager alerts)."""
    migrate.upgrade(postgres_url)
    settings = make_settings(postgres_url, tmp_path / "data", redis_url=redis_url)
    client = AppClient(create_app(settings))
    try:
        yield Api(client)
    finally:
        client.close()


def audit_actions(api: Api) -> list[str]:
    with Session(api.engine) as s:
        return [r[0] for r in s.execute(sa.text("SELECT action FROM audit_event ORDER BY id"))]


def test_every_state_changing_route_writes_an_audit_event(full_api: Api) -> None:
    api = full_api
    c = api.client
    admin = api.user_token("root", Role.admin)
    with Session(api.engine) as s:
        create_user(s, name="appr", role=Role.approver, password=PASSWORD, actor="test")
        s.commit()
    dash = DashboardApp(
        app=api.app, settings=api.app.state.settings, store=api.app.state.series_store, url=""
    )
    node_tok = api.node_token("n1")
    # A channel whose receiver refuses the connection: the test message fails fast, and the
    # attempt is what must be audited.
    api.app.state.alerts_config = parse_alerts_config(
        {
            "external_base_url": "http://127.0.0.1:8000",
            "channels": [
                {
                    "type": "webhook",
                    "name": "hook",
                    "url": f"http://127.0.0.1:{free_port()}/hook",
                    "signing_secret": "s" * 32,
                }
            ],
        }
    )

    def web_login_response() -> Any:
        form = c.get("/login")
        return c.post(
            "/login",
            data={
                "username": "appr",
                "password": PASSWORD,
                "next": "/",
                "csrf_token": csrf_from(form.text),
            },
        )

    def web_login() -> str:
        """The CSRF token of a signed-in browser session (signing in when needed)."""
        page = c.get("/settings")
        if page.status_code != 200:
            assert web_login_response().status_code == 303
            page = c.get("/settings")
        return csrf_from(page.text)

    token_ids: list[int] = []

    def create_token() -> Any:
        r = c.post("/api/v1/tokens", json={"node": "n2"}, headers=auth(admin))
        token_ids.append(r.json()["info"]["id"])
        return r

    def release_job() -> Any:
        # A job in SAFE_MODE whose approval was decided (rejected) may be released.
        part = {
            "job": "j5",
            "role": "trainer",
            "rank": 0,
            "phase": "TRAIN",
            "step": 1,
            "ts": time.time(),
        }
        known = c.post(
            "/api/v1/ingest", json=batch("n1", 1, participants=[part]), headers=auth(node_tok)
        )
        assert known.status_code == 200, known.text
        seeded = seed_heavy_incident(dash, job="j5")
        rejected = c.post(
            f"/api/v1/approvals/{seeded.approval_id}/reject",
            json={"comment": "restore later"},
            headers=auth(admin),
        )
        assert rejected.status_code == 200, rejected.text
        return c.post(
            "/api/v1/jobs/j5/release", json={"comment": "checked by hand"}, headers=auth(admin)
        )

    def set_automation() -> Any:
        part = {
            "job": "j6",
            "role": "rollout",
            "rank": 0,
            "phase": "ROLLOUT",
            "step": 1,
            "ts": time.time(),
        }
        known = c.post(
            "/api/v1/ingest",
            json=batch("n1", 0, agent="agent-j6", participants=[part]),
            headers=auth(node_tok),
        )
        assert known.status_code == 200, known.text
        return c.request(
            "PUT", "/api/v1/jobs/j6/automation", json={"hands_off": True}, headers=auth(admin)
        )

    def reset_breaker() -> Any:
        with Session(api.engine) as s:
            s.add(CircuitBreaker(scope="job:j6", open=True, reason="test", trips=1))
            s.commit()
        return c.post("/api/v1/breakers/job:j6/reset", headers=auth(admin))

    def reset_breaker_on_the_page() -> Any:
        with Session(api.engine) as s:
            s.add(CircuitBreaker(scope="job:j7", open=True, reason="test", trips=1))
            s.commit()
        return c.post("/breakers/job:j7/reset", data={"csrf_token": web_login()})

    def plan_drill() -> Any:
        part = {
            "job": "j8",
            "role": "trainer",
            "rank": 0,
            "phase": "TRAIN",
            "step": 1,
            "ts": time.time(),
        }
        known = c.post(
            "/api/v1/ingest",
            json=batch("n1", 0, agent="agent-j8", participants=[part]),
            headers=auth(node_tok),
        )
        assert known.status_code == 200, known.text
        # No worker serves n1 here: the drill is sent and answered 202 (not answered yet).
        api.app.state.settings.drills.answer_wait_seconds = 0.2
        return c.post(
            "/api/v1/drills",
            json={"job": "j8", "fault": "kill", "role": "trainer", "plan": True},
            headers=auth(admin),
        )

    cases: dict[tuple[str, str], tuple[Callable[[], Any], str]] = {
        ("POST", "/api/v1/drills"): (plan_drill, "drill.plan"),
        ("PUT", "/api/v1/jobs/{job}/automation"): (set_automation, "job.automation"),
        ("POST", "/api/v1/breakers/{scope}/reset"): (reset_breaker, "breaker.reset"),
        ("POST", "/api/v1/tokens"): (create_token, "token.create"),
        ("POST", "/api/v1/tokens/{token_id}/rotate"): (
            lambda: c.post(f"/api/v1/tokens/{token_ids[0]}/rotate", headers=auth(admin)),
            "token.rotate",
        ),
        ("DELETE", "/api/v1/tokens/{token_id}"): (
            lambda: c.delete(
                f"/api/v1/tokens/{create_token().json()['info']['id']}", headers=auth(admin)
            ),
            "token.revoke",
        ),
        ("POST", "/api/v1/users"): (
            lambda: c.post(
                "/api/v1/users", json={"name": "vic", "role": "viewer"}, headers=auth(admin)
            ),
            "user.create",
        ),
        ("POST", "/api/v1/users/{name}/disable"): (
            lambda: c.post("/api/v1/users/vic/disable", headers=auth(admin)),
            "user.disable",
        ),
        ("POST", "/api/v1/users/{name}/enable"): (
            lambda: c.post("/api/v1/users/vic/enable", headers=auth(admin)),
            "user.enable",
        ),
        ("PUT", "/api/v1/users/{name}/password"): (
            lambda: c.request(
                "PUT",
                "/api/v1/users/vic/password",
                json={"password": "a new long password"},
                headers=auth(admin),
            ),
            "user.set_password",
        ),
        ("DELETE", "/api/v1/users/{name}"): (
            lambda: c.delete("/api/v1/users/vic", headers=auth(admin)),
            "user.delete",
        ),
        ("POST", "/api/v1/auth/token"): (
            lambda: c.post("/api/v1/auth/token", json={"name": "appr", "password": PASSWORD}),
            "auth.login",
        ),
        ("POST", "/api/v1/approvals/{approval_id}/approve"): (
            lambda: c.post(
                f"/api/v1/approvals/{seed_heavy_incident(dash, job='j1').approval_id}/approve",
                json={"comment": "ok"},
                headers=auth(admin),
            ),
            "approval.approve",
        ),
        ("POST", "/api/v1/approvals/{approval_id}/reject"): (
            lambda: c.post(
                f"/api/v1/approvals/{seed_heavy_incident(dash, job='j2').approval_id}/reject",
                json={"comment": "no"},
                headers=auth(admin),
            ),
            "approval.reject",
        ),
        ("POST", "/api/v1/alertmanager"): (
            lambda: c.post(
                "/api/v1/alertmanager",
                headers=auth(admin),
                json={
                    "version": "4",
                    "status": "firing",
                    "receiver": "rlguard",
                    "groupKey": "g",
                    "alerts": [
                        {
                            "status": "firing",
                            "labels": {"alertname": "NodeDown", "node": "n5"},
                            "annotations": {},
                            "startsAt": "2026-11-29T10:00:00Z",
                            "endsAt": "0001-01-01T00:00:00Z",
                            "fingerprint": "ab",
                        }
                    ],
                },
            ),
            "alertmanager.webhook",
        ),
        ("POST", "/api/v1/alerts/test"): (
            lambda: c.post("/api/v1/alerts/test?channel=hook", headers=auth(admin)),
            "alerts.test",
        ),
        ("POST", "/api/v1/jobs/{job}/release"): (release_job, "job.release"),
        ("POST", "/api/v1/silences"): (
            lambda: c.post(
                "/api/v1/silences",
                headers=auth(admin),
                json={"matchers": [{"label": "node", "value": "n9"}], "duration_minutes": 5},
            ),
            "silence.create",
        ),
        ("POST", "/api/v1/silences/{silence_id}/expire"): (
            lambda: c.post(
                "/api/v1/silences/{}/expire".format(
                    c.post(
                        "/api/v1/silences",
                        headers=auth(admin),
                        json={
                            "matchers": [{"label": "node", "value": "n9"}],
                            "duration_minutes": 5,
                        },
                    ).json()["id"]
                ),
                headers=auth(admin),
            ),
            "silence.expire",
        ),
        # Alertmanager's API v2 (amtool, Grafana) writes the same silences, audited alike.
        ("POST", "/api/v2/silences"): (
            lambda: c.post("/api/v2/silences", headers=auth(admin), json=am_silence()),
            "silence.create",
        ),
        ("DELETE", "/api/v2/silence/{silence_id}"): (
            lambda: c.delete(
                "/api/v2/silence/{}".format(
                    c.post(
                        "/api/v2/silences",
                        headers=auth(admin),
                        json=am_silence(),
                    ).json()["silenceID"]
                ),
                headers=auth(admin),
            ),
            "silence.expire",
        ),
        ("POST", "/api/v1/maintenance-windows"): (
            lambda: c.post(
                "/api/v1/maintenance-windows",
                headers=auth(admin),
                json={
                    "node": "n9",
                    "recurrence": "weekly",
                    "weekday": 0,
                    "start_time": "02:00",
                    "duration_minutes": 60,
                },
            ),
            "maintenance_window.create",
        ),
        ("POST", "/api/v1/maintenance-windows/{window_id}/expire"): (
            lambda: c.post(
                "/api/v1/maintenance-windows/{}/expire".format(
                    c.post(
                        "/api/v1/maintenance-windows",
                        headers=auth(admin),
                        json={
                            "node": "n9",
                            "recurrence": "weekly",
                            "weekday": 0,
                            "start_time": "02:00",
                            "duration_minutes": 60,
                        },
                    ).json()["id"]
                ),
                headers=auth(admin),
            ),
            "maintenance_window.expire",
        ),
        ("POST", "/login"): (web_login_response, "web.login"),
        ("POST", "/approvals/{approval_id}/approve"): (
            lambda: c.post(
                f"/approvals/{seed_heavy_incident(dash, job='j3').approval_id}/approve",
                data={"csrf_token": web_login(), "comment": "ok"},
            ),
            "approval.approve",
        ),
        ("POST", "/approvals/{approval_id}/reject"): (
            lambda: c.post(
                f"/approvals/{seed_heavy_incident(dash, job='j4').approval_id}/reject",
                data={"csrf_token": web_login(), "comment": "no"},
            ),
            "approval.reject",
        ),
        ("POST", "/silences"): (
            lambda: c.post(
                "/silences",
                data={
                    "csrf_token": web_login(),
                    "matchers": "node=n8",
                    "duration": "1h",
                    "comment": "web",
                },
            ),
            "silence.create",
        ),
        ("POST", "/silences/{silence_id}/expire"): (
            lambda: c.post(
                "/silences/{}/expire".format(
                    c.post(
                        "/api/v1/silences",
                        headers=auth(admin),
                        json={
                            "matchers": [{"label": "node", "value": "n8"}],
                            "duration_minutes": 5,
                        },
                    ).json()["id"]
                ),
                data={"csrf_token": web_login()},
            ),
            "silence.expire",
        ),
        ("POST", "/breakers/{scope}/reset"): (reset_breaker_on_the_page, "breaker.reset"),
        ("POST", "/jobs/{name}/automation"): (  # j6 is known: the API's automation case ran first
            lambda: c.post(
                "/jobs/j6/automation", data={"csrf_token": web_login(), "dry_run": "true"}
            ),
            "job.automation",
        ),
        ("POST", "/logout"): (
            lambda: c.post("/logout", data={"csrf_token": web_login()}),
            "web.logout",
        ),
    }
    routes = state_changing_routes(api.app)
    assert set(cases) | NOT_AUDITED == routes, (
        f"no audit case for {sorted(routes - set(cases) - NOT_AUDITED)}; "
        f"stale cases {sorted(set(cases) - routes)}"
    )
    assert c.post("/api/v1/ingest", json=batch("n1", 0), headers=auth(node_tok)).status_code == 200
    for route, (call, action) in cases.items():
        before = audit_actions(api)
        r = call()
        assert r.status_code < 400, (route, r.status_code, r.text[:500])
        new = audit_actions(api)[len(before) :]
        assert action in new, f"{route} wrote {new}, expected {action!r}"
