"""The dashboard mounted on a bare FastAPI app (the same router and templates ``app.main``
mounts), a cookie-keeping browser for it, sign-in and CSRF helpers, and a seeded heavy incident.
Used by the view tests (tests/unit/app/views) and the integration tests of auth and the API."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import httpx
from anyio.from_thread import BlockingPortal
from fastapi import FastAPI
from sqlmodel import Session

from app.core.config import Settings
from app.series.store import SeriesStore

PASSWORD = "correct horse battery"


@functools.cache
def password_hash() -> str:
    from argon2 import PasswordHasher

    return PasswordHasher().hash(PASSWORD)


SECRET = "unit-test-secret-key-0123456789"


@dataclass
class DashboardApp:
    app: FastAPI
    settings: Settings
    store: SeriesStore
    url: str

    def session(self) -> Session:
        return Session(self.app.state.engine, expire_on_commit=False)


class Browser:
    """A synchronous HTTP client for the ASGI app that keeps cookies like a browser.

    (Starlette's TestClient warns that its httpx support is deprecated, and warnings are errors
    here; this is the same idea: an httpx.AsyncClient driven from a blocking portal.)
    """

    def __init__(
        self, portal: BlockingPortal, app: FastAPI, base_url: str = "http://testserver"
    ) -> None:
        self._portal = portal
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)
        self.cookies = self._client.cookies

    def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        kwargs.setdefault("follow_redirects", True)
        return self._portal.call(functools.partial(self._client.request, method, url, **kwargs))  # type: ignore[arg-type]

    def get(self, url: str, **kwargs: object) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: object) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self._portal.call(self._client.aclose)


CSRF_RE = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_from(html: str) -> str:
    match = CSRF_RE.search(html)
    assert match, "page has no CSRF field"
    return match.group(1)


def login(client: Browser, name: str, password: str = PASSWORD) -> str:
    """Signs ``client`` in; returns the CSRF token valid for the signed-in session."""
    form = client.get("/login")
    assert form.status_code == 200
    r = client.post(
        "/login",
        data={
            "username": name,
            "password": password,
            "csrf_token": csrf_from(form.text),
            "next": "/",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    page = client.get("/settings")
    assert page.status_code == 200
    return csrf_from(page.text)


@dataclass
class Seeded:
    incident_id: int
    approval_id: int
    action_ids: list[int]


def seed_heavy_incident(dash: DashboardApp, *, job: str = "grpo-a", node: str = "node-1") -> Seeded:
    """A heavy incident as the policy engine leaves it: SAFE_MODE done, restore waiting."""
    from datetime import timedelta

    from app.incidents.timeline import add_event
    from app.models import utcnow
    from app.models.action import RecoveryAction
    from app.models.approval import Approval
    from app.models.incident import Incident, IncidentEventType

    now = utcnow()
    with dash.session() as s:
        inc = Incident(
            key=f"storage_unwritable:job={job}",
            open_key=f"storage_unwritable:job={job}",
            kind="storage_unwritable",
            tier="heavy",
            subject={"job": job, "node": node},
            job=job,
            node=node,
            summary="State log not writable on node-1",
            # As the incident service stores it: the whole signal, its evidence inside.
            evidence={
                "kind": "storage_unwritable",
                "tier": "heavy",
                "subject": {"job": job, "node": node},
                "since": now.timestamp() - 30,
                "evidence": {
                    "metric": "state_log_write_latency_ms",
                    "values": [
                        [now.timestamp() - 60 + i, 40.0 + (i * 9 if i > 30 else 0)]
                        for i in range(60)
                    ],
                    "window_seconds": 20.0,
                    "threshold": 200.0,
                    "detail": "latency above 200 ms for 20 s",
                },
            },
            reasons=["storage unwritable is heavy tier"],
            safe_mode=True,
        )
        s.add(inc)
        s.flush()
        assert inc.id is not None
        add_event(s, incident_id=inc.id, type_=IncidentEventType.OPENED, detail={"tier": "heavy"})
        add_event(s, incident_id=inc.id, type_=IncidentEventType.SAFE_MODE, detail={"job": job})
        appr = Approval(
            incident_id=inc.id,
            summary="Restore grpo-a from its latest consistent checkpoint",
            expires_at=now + timedelta(hours=1),
        )
        s.add(appr)
        s.flush()
        assert appr.id is not None
        actions = [
            RecoveryAction(
                incident_id=inc.id,
                idempotency_key=f"{inc.id}:enter_safe_mode",
                action="enter_safe_mode",
                job=job,
                node=node,
                queue=f"node.{node}",
                status="succeeded",
                attempts=1,
                finished_at=now,
                result={"control_file": "written"},
            ),
            RecoveryAction(
                incident_id=inc.id,
                approval_id=appr.id,
                idempotency_key=f"{inc.id}:restore_checkpoint",
                action="restore_checkpoint",
                job=job,
                queue="cluster",
                status="pending_approval",
            ),
        ]
        for a in actions:
            s.add(a)
        add_event(
            s,
            incident_id=inc.id,
            type_=IncidentEventType.APPROVAL_REQUESTED,
            detail={"approval_id": appr.id},
        )
        s.commit()
        return Seeded(
            incident_id=inc.id, approval_id=appr.id, action_ids=[a.id for a in actions if a.id]
        )
