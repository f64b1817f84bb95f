"""The Job page's engine panel: each rollout engine's admission, the step whose weights it
serves, its train/inference disagreement and its live engine figures; a job without engines
has no panel, and the partial polls by itself."""

from __future__ import annotations

import time

from app.models import Job, Node, Participant, from_epoch
from app.series.store import SeriesKey
from tests.harness.dashboard import Browser, DashboardApp, login

HX = {"HX-Request": "true"}


def _job(dash: DashboardApp, name: str, *, engines: bool) -> None:
    now = time.time()
    with dash.session() as s:
        s.add(Node(name="node-1", last_seen_at=from_epoch(now - 1)))  # a fresh dashboard per test
        s.add(Job(name=name, last_seen_at=from_epoch(now - 1)))
        s.flush()
        for rank, phase in ((0, "ROLLOUT"), (1, "QUARANTINED")):
            s.add(
                Participant(
                    job_name=name,
                    role="rollout",
                    rank=rank,
                    node_name="node-1",
                    phase=phase,
                    step=7,
                    last_heartbeat_at=from_epoch(now - 1),
                )
            )
        s.commit()
    for rank, diff in ((0, 1.2e-7), (1, 0.41)):
        labels = {"job": name, "role": "rollout", "rank": str(rank)}
        dash.store.append(SeriesKey.of("node-1", "rollout_tokens_per_second", labels), now, 350.0)
        if engines:
            dash.store.append(
                SeriesKey.of("node-1", "rollout_logprob_diff_mean", labels), now, diff
            )
            dash.store.append(
                SeriesKey.of("node-1", "rollout_logprob_diff_max", labels), now, 2 * diff
            )
            engine = {**labels, "engine": "vllm"}
            dash.store.append(
                SeriesKey.of("node-1", "rollout_engine_requests_running", engine), now, 8
            )
            dash.store.append(
                SeriesKey.of("node-1", "rollout_engine_requests_waiting", engine), now, 2
            )
            dash.store.append(
                SeriesKey.of("node-1", "rollout_engine_kv_cache_usage_ratio", engine), now, 0.25
            )


def test_the_job_page_shows_each_engine(client: Browser, dash: DashboardApp) -> None:
    _job(dash, "grpo-vllm", engines=True)
    login(client, "vera")
    html = client.get("/jobs/grpo-vllm").text
    assert 'id="job-engines"' in html and 'data-engine="0"' in html and 'data-engine="1"' in html
    row1 = html.split('data-engine="1"')[1].split("</tr>")[0]
    assert "quarantined" in row1 and "0.41 / 0.82" in row1, row1
    row0 = html.split('data-engine="0"')[1].split("</tr>")[0]
    assert "admitted" in row0 and "1.2e-07" in row0 and "8 / 2" in row0 and "25 %" in row0, row0
    assert ">7<" in row0 and ">350<" in row0, row0
    part = client.get("/ui/jobs/grpo-vllm/engines", headers=HX)
    assert part.status_code == 200 and 'hx-trigger="every' in part.text and "<html" not in part.text
    assert client.get("/ui/jobs/none/engines", headers=HX).status_code == 404


def test_a_job_without_engines_has_no_engine_panel(client: Browser, dash: DashboardApp) -> None:
    _job(dash, "grpo-torch", engines=False)
    login(client, "vera")
    html = client.get("/jobs/grpo-torch").text
    assert (
        'id="job-engines"' in html and "data-engine=" not in html and "<h2>Engines</h2>" not in html
    )
