"""The Job page shows a GRPO trainer's reward when its integration reports one."""

from __future__ import annotations

from app.series.store import SeriesKey
from tests.harness.dashboard import Browser, DashboardApp, login
from tests.unit.app.views.test_pages import _chart_specs, _fleet


def test_reward_chart_only_for_a_job_that_reports_it(client: Browser, dash: DashboardApp) -> None:
    now = _fleet(dash)
    login(client, "vera")
    html = client.get("/jobs/grpo-a").text
    assert "GRPO reward (mean)" not in html  # no such signal: no empty chart
    labels = {"job": "grpo-a", "role": "trainer", "rank": "0"}
    for t, value in enumerate((-0.2, 0.05, 0.125)):
        dash.store.append(
            SeriesKey.of("node-1", "grpo_reward_mean", labels), now - 30 + t * 10, value
        )
    html = client.get("/jobs/grpo-a").text
    assert "<h3>GRPO reward (mean)</h3>" in html and "0.125" in html
    [reward] = [s for s in _chart_specs(html) if s["series"] and s["series"][0]["label"] == "trainer/0"
                and 0.125 in s["series"][0]["values"]]  # fmt: skip
    assert [v for v in reward["series"][0]["values"] if v is not None] == [-0.2, 0.05, 0.125]
