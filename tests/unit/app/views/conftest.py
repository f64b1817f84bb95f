"""A dashboard app on a migrated SQLite database, with a signed-in browser per role.

The app here is the real router and templates mounted on a bare FastAPI app (the same objects
``app.main`` puts on ``app.state``), so these tests exercise views, services and templates
without starting a server process; tests/e2e/ drives the real ``rlguard server``. The helpers
live in ``tests/harness/dashboard.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastapi import FastAPI
from sqlmodel import Session

from app.core.config import Settings
from app.core.db import make_engine
from app.core.migrate import upgrade
from app.core.ratelimit import LoginNameThrottle
from app.ingest.quotas import NodeQuotas
from app.models import Role, User
from app.runtime import load_running_policy
from app.series.store import SeriesStore
from app.views import mount_dashboard
from app.views.models.overview import DashboardCaches
from tests.harness.dashboard import SECRET, Browser, DashboardApp, password_hash


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
    app.state.node_quotas = NodeQuotas(settings.node_quotas)
    # The per-name login limit the login form applies (app.main sets all of them up).
    app.state.rate_limiters = {"login_name": LoginNameThrottle(rate=1.0, burst=1000)}
    mount_dashboard(app)
    with Session(engine) as s:
        for name, role in (
            ("vera", "viewer"),
            ("otto", "operator"),
            ("alice", "approver"),
            ("adam", "admin"),
        ):
            # One argon2 hash for every user and test: hashing is the slow part here.
            s.add(User(name=name, role=Role(role), password_hash=password_hash()))
        s.commit()
    yield DashboardApp(app=app, settings=settings, store=app.state.series_store, url=url)
    engine.dispose()


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
