"""Guard-rails on the dashboard: the Overview's breakers (Reset for approvers only, audited, CSRF
checked), the dry run / hands off badges on the job list and the job page, and the job page's
toggles (dry run: operator, hands off: approver; a refusal shows its reason, changes nothing)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlmodel import Session, select

from app.guardrails import breaker
from app.models import AuditEvent, Job, Role, from_epoch
from app.models.guardrails import CircuitBreaker, JobAutomation
from app.views.models.guardrails import breaker_panel, job_switches
from tests.harness.dashboard import Browser, DashboardApp, login

TRIPPED = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)


def _seed(dash: DashboardApp, *, job: str = "grpo-a") -> None:
    with Session(dash.app.state.engine) as s:
        s.add(Job(name=job, last_seen_at=from_epoch(time.time() - 1)))
        s.flush()
        for scope in (breaker.CLUSTER_SCOPE, breaker.job_scope(job)):
            why = breaker.Trip(scope=scope, reason=f"9 automatic actions in 1h (limit 8) {scope}")
            breaker.trip(s, why, incident_id=None, now=TRIPPED)
        s.commit()


def _breaker(dash: DashboardApp, scope: str) -> CircuitBreaker:
    with Session(dash.app.state.engine) as s:
        row = s.get(CircuitBreaker, scope)
        assert row is not None
        return row


def _audit(dash: DashboardApp) -> list[AuditEvent]:
    with Session(dash.app.state.engine) as s:
        return list(s.exec(select(AuditEvent)).all())


def test_breaker_panel_lists_the_cluster_even_untripped_and_open_ones_first(
    dash: DashboardApp,
) -> None:
    with Session(dash.app.state.engine) as s:
        panel = breaker_panel(s, role=Role.viewer)
        assert [(r.scope, r.state, r.level) for r in panel.rows] == [("cluster", "closed", "ok")]
        assert panel.can_reset is False and panel.open_count == 0
        s.add(Job(name="grpo-a"))
        s.flush()
        breaker.trip(s, breaker.Trip("job:grpo-a", "too many"), incident_id=None, now=TRIPPED)
        panel = breaker_panel(s, role=Role.approver)
    assert [(r.scope, r.job, r.state) for r in panel.rows] == [
        ("job:grpo-a", "grpo-a", "open"),
        ("cluster", None, "closed"),
    ]
    assert panel.can_reset is True and panel.open_count == 1
    assert panel.rows[0].reason == "too many" and panel.rows[0].tripped_at == TRIPPED


def test_approver_sees_open_breakers_and_resets_one(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    csrf = login(client, "alice")
    page = client.get("/")
    assert page.status_code == 200 and 'id="overview-breakers"' in page.text
    assert 'data-testid="breakers-open">2 open<' in page.text
    assert "9 automatic actions in 1h (limit 8) cluster" in page.text
    assert "2026-12-01 08:30:00" in page.text
    assert page.text.count(">Reset</button>") == 2
    r = client.post("/breakers/cluster/reset", data={"csrf_token": csrf, "comment": "image fixed"},
                    headers={"HX-Request": "true"})  # fmt: skip
    assert r.status_code == 200 and r.text.lstrip().startswith(
        '<section class="panel" id="overview-breakers"'
    )
    assert r.text.count(">Reset</button>") == 1
    row = _breaker(dash, "cluster")
    assert (row.open, row.reset_by) == (False, "user:alice")
    [event] = [e for e in _audit(dash) if e.action == "breaker.reset"]
    assert (event.actor, event.target) == ("user:alice", "cluster")
    assert event.detail["comment"] == "image fixed"
    # A plain form post (no htmx) resets the job's breaker and comes back to the Overview.
    r = client.post("/breakers/job%3Agrpo-a/reset", data={"csrf_token": csrf})
    assert r.status_code == 200 and str(r.url).endswith("/")
    assert _breaker(dash, "job:grpo-a").open is False
    # Resetting a closed one again: the subsystem's reason, nothing written.
    r = client.post("/breakers/cluster/reset", data={"csrf_token": csrf})
    assert r.status_code == 409 and "is not open" in r.text
    assert r.headers["X-RLGuard-Reason"] == "breaker 'cluster' is not open"
    assert len([e for e in _audit(dash) if e.action == "breaker.reset"]) == 2


def test_viewer_and_operator_see_breakers_but_no_reset_and_cannot_post(
    client: Browser, dash: DashboardApp
) -> None:
    _seed(dash)
    for name in ("vera", "otto"):
        client.cookies.clear()
        csrf = login(client, name)
        page = client.get("/")
        assert 'data-testid="breaker-cluster"' in page.text and "/reset" not in page.text
        partial = client.get("/ui/overview/breakers")
        assert "open" in partial.text and "/reset" not in partial.text
        r = client.post("/breakers/cluster/reset", data={"csrf_token": csrf})
        assert r.status_code == 403 and "needs the approver role" in r.text
    assert _breaker(dash, "cluster").open is True
    assert not [e for e in _audit(dash) if e.action == "breaker.reset"]


def test_reset_without_csrf_is_refused(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    login(client, "alice")
    assert client.post("/breakers/cluster/reset", data={}).status_code == 403
    assert _breaker(dash, "cluster").open is True


def test_badges_on_the_job_list_and_the_job_page(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    with Session(dash.app.state.engine) as s:
        s.add(Job(name="quiet", last_seen_at=from_epoch(time.time() - 1)))
        s.add(JobAutomation(job_name="grpo-a", dry_run=True, hands_off=True, updated_by="x"))
        s.commit()
    login(client, "vera")
    jobs = client.get("/ui/overview/jobs").text
    assert jobs.count('data-testid="badge-dry-run"') == 1
    assert jobs.count('data-testid="badge-hands-off"') == 1
    page = client.get("/jobs/grpo-a").text
    assert 'data-testid="badge-dry-run"' in page and 'data-testid="badge-hands-off"' in page
    # A viewer sees the switches and why they are not hers to change.
    assert "/automation" not in page and "needs the operator role" in page
    quiet = client.get("/jobs/quiet").text
    assert "badge-dry-run" not in quiet and "badge-hands-off" not in quiet


def test_job_switches_by_role(dash: DashboardApp) -> None:
    _seed(dash)
    with Session(dash.app.state.engine) as s:
        op = job_switches(s, job="grpo-a", role=Role.operator)
        ap = job_switches(s, job="grpo-a", role=Role.approver)
    assert (op.dry_run, op.hands_off, op.updated_at) == (False, False, None)
    assert (op.can_dry_run, op.can_hands_off) == (True, False)
    assert (ap.can_dry_run, ap.can_hands_off) == (True, True)


def test_operator_switches_dry_run_but_not_hands_off(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    csrf = login(client, "otto")
    page = client.get("/jobs/grpo-a").text
    assert 'name="dry_run"' in page and 'name="hands_off"' not in page
    assert "needs the approver role" in page
    r = client.post("/jobs/grpo-a/automation", data={"csrf_token": csrf, "dry_run": "true"},
                    headers={"HX-Request": "true"})  # fmt: skip
    assert r.status_code == 200 and 'id="job-automation"' in r.text
    assert 'data-testid="badge-dry-run"' in r.text
    r = client.post("/jobs/grpo-a/automation",
                    data={"csrf_token": csrf, "dry_run": "false", "hands_off": "true"})  # fmt: skip
    assert r.status_code == 403
    assert "hands_off needs the approver role; otto is operator" in r.text
    with Session(dash.app.state.engine) as s:
        row = s.get(JobAutomation, "grpo-a")
        assert row is not None and (row.dry_run, row.hands_off) == (True, False)
    assert [e.action for e in _audit(dash)].count("job.automation") == 1


def test_approver_switches_hands_off_audited(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    csrf = login(client, "alice")
    r = client.post("/jobs/grpo-a/automation",
                    data={"csrf_token": csrf, "hands_off": "true", "reason": "manual debug"})  # fmt: skip
    assert r.status_code == 200 and str(r.url).endswith("/jobs/grpo-a")
    assert 'data-testid="badge-hands-off"' in r.text
    [event] = [e for e in _audit(dash) if e.action == "job.automation"]
    assert event.actor == "user:alice" and event.detail["reason"] == "manual debug"
    assert event.detail["after"] == {"dry_run": False, "hands_off": True}
    r = client.post("/jobs/nope/automation", data={"csrf_token": csrf, "hands_off": "true"})
    assert r.status_code == 404 and "not found" in r.text
    r = client.post("/jobs/grpo-a/automation", data={"csrf_token": csrf})
    assert r.status_code == 422 and "nothing to change" in r.text


def test_viewer_cannot_switch_and_csrf_is_checked(client: Browser, dash: DashboardApp) -> None:
    _seed(dash)
    csrf = login(client, "vera")
    r = client.post("/jobs/grpo-a/automation", data={"csrf_token": csrf, "dry_run": "true"})
    assert r.status_code == 403 and "dry_run needs the operator role; vera is viewer" in r.text
    client.cookies.clear()
    login(client, "alice")
    r = client.post("/jobs/grpo-a/automation", data={"dry_run": "true"})
    assert r.status_code == 403
    with Session(dash.app.state.engine) as s:
        assert s.get(JobAutomation, "grpo-a") is None
