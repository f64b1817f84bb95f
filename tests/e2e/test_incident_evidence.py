"""Evidence and runbooks in real Chromium against a real ``rlguard server``.

One incident of every kind the labelled trace corpus opens (the real signals its detectors
attach, persisted through the incident writer as the policy tick does) is opened in the browser:
its Evidence panel is never empty and never a one-point plot; a heartbeat shows its age against
the suspect and confirm thresholds, a hang its stuck time against its limit; a chart's legend
shows a value, not a dash, while the cursor is off it. The runbook link of an incident and of an
approval opens the rendered runbook. Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from app.alerts import service as alert_service
from app.alerts.config import AlertsConfig
from app.core.db import make_engine
from app.incidents.persist import persist_decisions
from app.models.approval import Approval
from app.policy.policy_file import default_policy
from tests.e2e._cluster import Cluster, screenshot, sign_in
from tests.harness.corpus_incidents import first_opened_per_kind

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

WAIT_MS = 15_000
LIVENESS = {"heartbeat_lost", "node_silent", "nodes_lost"}


def _engine(cluster: Cluster) -> Engine:
    return make_engine(f"sqlite:///{cluster.data_dir / 'rlguard.db'}")


def _persist_one_incident_per_kind(engine: Engine) -> dict[str, int]:
    """kind -> incident id, written by the incident writer from the corpus's decisions."""
    ids: dict[str, int] = {}
    alert_service.configure(config=AlertsConfig())  # no channel: nothing to send
    try:
        for kind, decision in sorted(first_opened_per_kind().items()):
            with Session(engine) as s:
                out = persist_decisions(
                    s,
                    decisions=[decision],
                    policy=default_policy(),
                    now=datetime.fromtimestamp(decision.at, UTC),
                )
                s.commit()
            [ids[kind]] = out.opened
    finally:
        alert_service.configure(config=None)
    return ids


def _page(browser: object) -> object:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    page = ctx.new_page()
    page.set_default_timeout(WAIT_MS)
    return page


def test_every_kind_shows_its_evidence_and_links_its_runbook(
    cluster: Cluster, browser: object
) -> None:
    engine = _engine(cluster)
    try:
        ids = _persist_one_incident_per_kind(engine)
        with Session(engine) as s:
            approvals = {a.incident_id: a.id for a in s.exec(select(Approval)).all()}
    finally:
        engine.dispose()
    assert {"heartbeat_lost", "train_hang", "rollout_pending_high"} <= set(ids), sorted(ids)

    page = _page(browser)
    sign_in(page, cluster.base_url, "vera")
    charted = []
    for kind, incident_id in sorted(ids.items()):
        page.goto(f"{cluster.base_url}/incidents/{incident_id}")  # type: ignore[attr-defined]
        panel = page.wait_for_selector(f'[data-testid=evidence][data-kind="{kind}"]')  # type: ignore[attr-defined]
        text = panel.inner_text()
        assert page.locator("[data-testid=evidence-detail]").inner_text().strip(), kind  # type: ignore[attr-defined]
        assert "No data in this window" not in text, kind
        charts = page.locator("[data-testid=evidence] .js-chart")  # type: ignore[attr-defined]
        if charts.count():
            charted.append(kind)
            page.wait_for_selector("[data-testid=evidence] .js-chart canvas")  # type: ignore[attr-defined]
            legend = page.locator("[data-testid=evidence] .u-legend .u-series .u-value")  # type: ignore[attr-defined]
            values = [legend.nth(i).inner_text().strip() for i in range(legend.count())]
            assert values and all(v not in ("", "–", "--") for v in values), (kind, values)
        if kind in LIVENESS:
            assert charts.count() == 0, f"{kind}: a heartbeat has no series to plot"
            gauge = page.locator("[data-testid=evidence-gauge]")  # type: ignore[attr-defined]
            assert gauge.count() == 1, kind
            assert "suspect 15 s" in gauge.inner_text() and "confirmed 75 s" in gauge.inner_text()
        if kind == "train_hang":
            gauge = page.locator("[data-testid=evidence-gauge]").inner_text()  # type: ignore[attr-defined]
            assert "Stuck at step" in gauge and "limit " in gauge
        if kind in ("heartbeat_lost", "train_hang", "rollout_pending_high", "straggler"):
            panel.screenshot(
                path=str(
                    screenshot(page, f"evidence-{kind}").with_name(f"evidence-{kind}-panel.png")
                )
            )

    # The golden metrics are series: their charts were drawn and their legends checked above.
    assert {"rollout_pending_high", "state_log_slow"} <= set(charted), charted

    # The runbook from an incident page...
    page.goto(f"{cluster.base_url}/incidents/{ids['heartbeat_lost']}")  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        page.click("[data-testid=runbook-link]")  # type: ignore[attr-defined]
    runbook = page.wait_for_selector("[data-testid=runbook]")  # type: ignore[attr-defined]
    assert page.url.endswith("/runbooks/heartbeat_lost")  # type: ignore[attr-defined]
    assert runbook.query_selector("h1").inner_text().startswith("heartbeat_lost")
    assert "Approve or reject" in runbook.inner_text()
    screenshot(page, "runbook-heartbeat_lost")
    # ... and from an approval of a heavy plan.
    heavy = next(i for k, i in sorted(ids.items()) if i in approvals)
    kind = next(k for k, i in ids.items() if i == heavy)
    page.goto(f"{cluster.base_url}/approvals/{approvals[heavy]}")  # type: ignore[attr-defined]
    with page.expect_navigation():  # type: ignore[attr-defined]
        page.click(f"#approval-{approvals[heavy]} [data-testid=runbook-link]")  # type: ignore[attr-defined]
    page.wait_for_selector("[data-testid=runbook] h2")  # type: ignore[attr-defined]
    assert page.url.endswith(f"/runbooks/{kind}")  # type: ignore[attr-defined]
