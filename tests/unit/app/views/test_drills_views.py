"""The Drills page: past drills with their report figures (every job's, or one job's from its
Job page's link), a refused one with its reason; a bad or unknown job filter is a clear 4xx
page naming it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlmodel import Session

from app.core.db import make_engine
from app.models import Job
from app.models.drill import Drill
from tests.harness.dashboard import Browser, DashboardApp, login

T0 = datetime(2026, 12, 6, 1, 0, tzinfo=UTC)
REPORT = {
    "incident": {
        "id": 7,
        "kind": "heartbeat_lost",
        "tier": "medium",
        "status": "resolved",
        "summary": "s",
    },
    "detection_delay_seconds": 0.34,
    "time_to_first_new_step_seconds": 4.12,
    "actions": [{"action": "restart_role", "status": "succeeded", "finished_after_seconds": 3}],
    "steps_redone": 0,
    "generations_redone": 16,
    "unit": "rollouts",
    "batches_redone": 1,
    "seconds_lost": 1.31,
    "whole_job_restart": {"seconds_lost": 1866.1, "steps_redone": 20},
    "recovered": True,
    "state": "recovered: the job made a new step",
}


def _seed(dash: DashboardApp) -> None:
    engine = make_engine(dash.url)
    try:
        with Session(engine) as s:
            s.add(Job(name="ref"))
            s.add(Job(name="other"))
            base = dict(role="rollout", rank=1, node="n1", requested_by="user:otto")
            s.add(
                Drill(
                    job="ref",
                    fault="kill",
                    status="recovered",
                    requested_at=T0,
                    injected_at=T0 + timedelta(seconds=1),
                    report=REPORT,
                    **base,
                )
            )
            s.add(
                Drill(
                    job="ref",
                    fault="hang",
                    status="refused",
                    requested_at=T0,
                    reason="the launcher did not answer within 60 s: the request was withdrawn",
                    **base,
                )
            )
            s.add(Drill(job="other", fault="kill", status="injected", requested_at=T0, **base))
            s.add(
                Drill(job="ref", fault="kill", status="planned", plan=True, requested_at=T0, **base)
            )
            s.commit()
    finally:
        engine.dispose()


def test_the_drills_page_lists_drills_with_their_figures(
    dash: DashboardApp, client: Browser
) -> None:
    _seed(dash)
    login(client, "vera")  # a viewer reads drills
    page = client.get("/drills")
    assert page.status_code == 200
    html = page.text
    assert 'data-testid="drill-1"' in html and 'data-testid="drill-3"' in html
    assert 'data-testid="drill-4"' not in html  # a plan is not a drill that ran
    for text in (
        "#7 heartbeat_lost (medium, resolved)",
        "0.3 s",
        "restart_role: succeeded",
        "4.1 s",
        "16 rollouts",
        "1.3 s",
        "1866.1 s lost, 20 steps redone",
        "the launcher did not answer within 60 s: the request was withdrawn",
    ):
        assert text in html, text
    assert '<a href="/incidents/7">' in html
    one = client.get("/drills?job=ref")
    assert one.status_code == 200 and "Drills of ref" in one.text
    assert 'data-testid="drill-1"' in one.text and 'data-testid="drill-3"' not in one.text


def test_the_job_page_links_its_drills(dash: DashboardApp, client: Browser) -> None:
    _seed(dash)
    login(client, "vera")
    page = client.get("/jobs/ref")
    assert page.status_code == 200
    assert 'href="/drills?job=ref" data-testid="job-drills"' in page.text


def test_a_bad_or_unknown_job_filter_is_a_4xx_naming_it(
    dash: DashboardApp, client: Browser
) -> None:
    _seed(dash)
    login(client, "vera")
    bad = client.get("/drills", params={"job": "no such/job"})
    assert bad.status_code == 422
    assert "job &#39;no such/job&#39; is not a job name" in bad.text
    unknown = client.get("/drills", params={"job": "ghost"})
    assert unknown.status_code == 404 and "no job named &#39;ghost&#39;" in unknown.text
    empty = client.get("/drills", params={"job": "other"})
    assert empty.status_code == 200 and 'data-testid="drill-3"' in empty.text
