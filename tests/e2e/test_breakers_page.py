"""The Overview's circuit breakers in real Chromium against a real ``rlguard server``: an
approver sees an open breaker (tripped through the subsystem in the setup) and resets it with the
htmx button (after the confirmation); the row turns closed in place and the reset is audited. A
viewer sees the breakers and no Reset button."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

import app.models.incident  # noqa: F401  (the breaker row's foreign key needs its table)
from app.core.db import make_engine
from app.guardrails import breaker
from app.models import AuditEvent
from app.models.guardrails import CircuitBreaker
from tests.e2e._cluster import Cluster, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]

WAIT_MS = 15_000
REASON = "5 automatic actions in 1h (limit 4)"


def _page(browser: object) -> object:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    page.on("dialog", lambda dialog: dialog.accept())
    return page


def _engine(cluster: Cluster) -> Engine:
    return make_engine(f"sqlite:///{cluster.data_dir / 'rlguard.db'}")


def test_approver_resets_an_open_breaker_viewer_sees_no_button(
    cluster: Cluster, browser: object
) -> None:
    engine = _engine(cluster)
    try:
        with Session(engine) as s:
            when = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)
            breaker.trip(s, breaker.Trip(breaker.CLUSTER_SCOPE, REASON), incident_id=None, now=when)
            s.commit()

        viewer = _page(browser)
        sign_in(viewer, cluster.base_url, "vera")
        viewer.goto(f"{cluster.base_url}/")  # type: ignore[attr-defined]
        row = viewer.locator("[data-testid=breaker-cluster]")  # type: ignore[attr-defined]
        assert row.locator("[data-testid=state]").inner_text() == "open"
        assert REASON in row.inner_text()
        assert viewer.locator("#overview-breakers").get_by_role("button", name="Reset").count() == 0  # type: ignore[attr-defined]

        page = _page(browser)
        sign_in(page, cluster.base_url, "alice")
        page.goto(f"{cluster.base_url}/")  # type: ignore[attr-defined]
        row = page.locator("[data-testid=breaker-cluster]")  # type: ignore[attr-defined]
        assert row.locator("[data-testid=state]").inner_text() == "open"
        assert REASON in row.inner_text() and "2026-12-01 08:30:00" in row.inner_text()
        row.get_by_role("button", name="Reset").click()
        # The htmx swap replaces the panel in place: closed, and the button gone.
        page.wait_for_function(  # type: ignore[attr-defined]
            "() => document.querySelector('[data-testid=breaker-cluster] [data-testid=state]')"
            "?.textContent === 'closed'"
        )
        assert page.locator("#overview-breakers").get_by_role("button", name="Reset").count() == 0  # type: ignore[attr-defined]
        assert "user:alice" in page.locator("[data-testid=breaker-cluster]").inner_text()  # type: ignore[attr-defined]

        with Session(engine) as s:
            stored = s.get(CircuitBreaker, breaker.CLUSTER_SCOPE)
            assert stored is not None and (stored.open, stored.reset_by) == (False, "user:alice")
            audit = s.exec(select(AuditEvent).where(AuditEvent.action == "breaker.reset")).all()
            assert [(e.actor, e.target) for e in audit] == [("user:alice", "cluster")]
    finally:
        engine.dispose()
