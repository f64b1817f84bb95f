"""The Job page's goodput panel in real Chromium: ETTR over time, the per-incident waterfall
(detect / approve / recover / redo) and the savings with their assumptions; the overview's
cluster ETTR tiles; the window switch (an htmx partial) and a phone viewport.

The job's step reports reach the real server through ``POST /api/v1/ingest``; its incidents
are written into the server's database by the same service calls the policy engine, the worker
and the approvals/release API make (``tests/integration/goodput/_history``), with their own
timestamps, so the page shows known figures. The screenshot is saved to
``artifacts/screenshots/job-goodput-desktop.png`` (the committed copy is in docs/screenshots/).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.e2e._cluster import NODES, Cluster, screenshot, sign_in
from tests.integration.goodput._history import (
    JOB,
    build_incidents,
    start,
    step_reports,
    trainer_steps,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(180)]

DESKTOP = {"width": 1440, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def ids(cluster: Cluster) -> Iterator[dict[str, int]]:
    # The history ends (t0 + 860) ten seconds ago, arrives in one batch per node, and the job
    # then reports DONE until the end of the module: a finished job, not a silent one (the
    # server's policy engine would otherwise, rightly, open heartbeat incidents of its own).
    t0 = start(ago=870)
    history: dict[str, list[dict[str, object]]] = {node: [] for node in NODES}
    for node, participants in step_reports(t0, job=JOB, steps=trainer_steps(), nodes=NODES):
        history[node].extend(participants)
    for node, participants in history.items():  # one batch per node, reports in time order
        cluster.ingest(node, [], participants)
    stop = threading.Event()

    def report_done() -> None:
        while not stop.wait(2.0):
            for node, participants in step_reports(
                time.time(), job=JOB, steps=[(0.0, 55)], nodes=NODES
            ):
                cluster.ingest(node, [], [dict(p, phase="DONE") for p in participants])

    keepalive = threading.Thread(target=report_done, name="goodput-done-reports", daemon=True)
    keepalive.start()
    engine = sa.create_engine(f"sqlite:///{cluster.data_dir / 'rlguard.db'}")
    try:
        yield build_incidents(engine, t0, approver="alice", node=NODES[0])
    finally:
        stop.set()
        keepalive.join(10)
        engine.dispose()


def _page(browser: object, viewport: dict[str, int], *, phone: bool = False) -> object:
    ctx = browser.new_context(  # type: ignore[attr-defined]
        viewport=viewport, device_scale_factor=2 if phone else 1, is_mobile=phone, has_touch=phone
    )
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.js_errors = errors  # type: ignore[attr-defined]
    return page


def test_job_page_shows_ettr_waterfall_and_savings(
    cluster: Cluster, ids: dict[str, int], browser: object
) -> None:
    page = _page(browser, DESKTOP)
    sign_in(page, cluster.base_url, "vera")
    page.goto(f"{cluster.base_url}/jobs/{JOB}")  # type: ignore[attr-defined]
    panel = page.wait_for_selector("[data-testid=job-goodput]")  # type: ignore[attr-defined]
    assert panel is not None
    # The heavy incident: SAFE_MODE from 460 until the release was asked for at 700 is approval.
    row = page.wait_for_selector(f"[data-incident='{ids['C']}']")  # type: ignore[attr-defined]
    segs = {
        s.get_attribute("data-segment"): int(s.get_attribute("data-seconds"))
        for s in row.query_selector_all(".wf-seg")
    }
    assert segs == {"detect": 5, "approve": 240, "recover": 5, "redo": 10}
    a_row = page.query_selector(f"[data-incident='{ids['A']}']")  # type: ignore[attr-defined]
    assert "2 steps redone" in a_row.inner_text()
    b_row = page.query_selector(f"[data-incident='{ids['B']}']")  # type: ignore[attr-defined]
    assert "overlaps an earlier incident" in b_row.inner_text()
    # Each segment is drawn: a visible box with a width.
    box = row.query_selector(".seg-approve").bounding_box()
    assert box is not None and box["width"] > 50
    bars = page.query_selector_all("[data-testid=ettr-over-time] .ettr-bar")  # type: ignore[attr-defined]
    assert len(bars) >= 12
    assert float(page.inner_text("[data-testid=job-ettr]")) < 1.0  # type: ignore[attr-defined]
    saved = page.inner_text("[data-testid=gpu-hours-saved]")  # type: ignore[attr-defined]
    assert float(saved.split()[0]) > 0
    assumptions = page.inner_text("[data-testid=goodput-assumptions]")  # type: ignore[attr-defined]
    for words in (
        "human detection delay",
        "30m 00s",
        "price per GPU-hour",
        "$2.50",
        "job start-up",
    ):
        assert words in assumptions
    row.scroll_into_view_if_needed()
    screenshot(page, "job-goodput-desktop")

    # The 7-day window through the htmx partial, without a page load.
    page.click("#job-goodput a[hx-get$='window=7d']")  # type: ignore[attr-defined]
    page.wait_for_selector("#job-goodput a.current:text('7d')")  # type: ignore[attr-defined]
    assert "last 7 days" in page.inner_text("#job-goodput .panel-head")  # type: ignore[attr-defined]
    assert page.query_selector(f"[data-incident='{ids['C']}']") is not None  # type: ignore[attr-defined]

    page.goto(f"{cluster.base_url}/")  # type: ignore[attr-defined]
    tiles = page.wait_for_selector("[data-testid=cluster-ettr]")  # type: ignore[attr-defined]
    for window, label in (("24h", "last 24 h"), ("7d", "last 7 days")):
        tile = tiles.query_selector(f"[data-window='{window}']")
        assert label in tile.text_content()
        assert 0.0 < float(tile.query_selector(".value").inner_text()) < 1.0  # the job's faults
    assert page.js_errors == []  # type: ignore[attr-defined]


def test_goodput_panel_on_a_phone(cluster: Cluster, ids: dict[str, int], browser: object) -> None:
    page = _page(browser, PHONE, phone=True)
    sign_in(page, cluster.base_url, "vera")
    page.goto(f"{cluster.base_url}/jobs/{JOB}")  # type: ignore[attr-defined]
    row = page.wait_for_selector(f"[data-incident='{ids['C']}']")  # type: ignore[attr-defined]
    track = row.query_selector(".wf-track").bounding_box()
    assert track is not None and track["width"] > 250  # the track takes the row, not a sliver
    width = page.evaluate("document.documentElement.scrollWidth")  # type: ignore[attr-defined]
    assert width <= PHONE["width"] + 1  # nothing overflows sideways
    screenshot(page, "job-goodput-phone")
