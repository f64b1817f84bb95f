"""A dashboard app on a migrated SQLite database, with a signed-in browser per role.

The app here is the real router and templates mounted on a bare FastAPI app (the same objects
``app.main`` puts on ``app.state``), so these tests exercise views, services and templates
without starting a server process; tests/e2e/ drives the real ``rlguard server``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from sqlmodel import Session

from app.core.config import Settings
from app.core.db import make_engine
from app.core.migrate import upgrade
from app.core.ratelimit import TokenBucketLimiter
from app.ingest.series_store import SeriesStore
from app.models import Role, User
from app.runtime import load_running_policy
from app.views import mount_dashboard
from app.views.models.overview import DashboardCaches

PASSWORD = "correct horse battery"


@functools.cache
def _password_hash() -> str:
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


@pytest.fixture
def dash(tmp_path: Path) -> Iterator[DashboardApp]:
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    upgrade(url)
    settings = Settings(data_dir=tmp_path, database_url=url, secret_key=SECRET)
    engine = make_engine(url)
    app = FastAPI()
    app.state.settings = settings
    app.state.engine = engine
    app.state.series_store = SeriesStore()
    app.state.policy = load_running_policy(settings)
    app.state.dashboard_caches = DashboardCaches()
    # The per-name login limit the login form applies (app.main sets all of them up).
    app.state.rate_limiters = {"login_name": TokenBucketLimiter(rate=1.0, burst=1000)}
    mount_dashboard(app)
    with Session(engine) as s:
        for name, role in (
            ("vera", "viewer"),
            ("otto", "operator"),
            ("alice", "approver"),
            ("adam", "admin"),
        ):
            # One argon2 hash for every user and test: hashing is the slow part here.
            s.add(User(name=name, role=Role(role), password_hash=_password_hash()))
        s.commit()
    yield DashboardApp(app=app, settings=settings, store=app.state.series_store, url=url)
    engine.dispose()


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


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as p:
        yield p


@pytest.fixture
def client(dash: DashboardApp, portal: BlockingPortal) -> Iterator[Browser]:
    browser = Browser(portal, dash.app)
    yield browser
    browser.close()


@pytest.fixture
def https_client(dash: DashboardApp, portal: BlockingPortal) -> Iterator[Browser]:
    """A browser on an HTTPS origin (as behind a TLS-terminating, trusted proxy)."""
    browser = Browser(portal, dash.app, base_url="https://testserver")
    yield browser
    browser.close()


@pytest.fixture
def other_client(dash: DashboardApp, portal: BlockingPortal) -> Iterator[Browser]:
    browser = Browser(portal, dash.app)
    yield browser
    browser.close()


@pytest.fixture(autouse=True)
def _no_alert_channels() -> Iterator[None]:
    """Incident timelines feed the alerts service; here it has no channel, so nothing is sent."""
    from app.alerts import service as alerts
    from app.alerts.config import AlertsConfig

    alerts.configure(config=AlertsConfig(channels=()))
    yield
    alerts.configure(config=None)


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
            s, incident_id=inc.id, type_=IncidentEventType.APPROVAL_REQUESTED, detail={"approval_id": appr.id}
        )
        s.commit()
        return Seeded(
            incident_id=inc.id, approval_id=appr.id, action_ids=[a.id for a in actions if a.id]
        )
