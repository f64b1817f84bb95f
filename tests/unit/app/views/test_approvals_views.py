"""Approvals from the dashboard: roles, CSRF, decisions through the approvals service."""

from __future__ import annotations

from sqlmodel import select

from app.models import AuditEvent
from app.models.action import RecoveryAction
from app.models.approval import Approval
from app.models.incident import IncidentEvent
from tests.harness.dashboard import Browser, DashboardApp, login, seed_heavy_incident

HX = {"HX-Request": "true"}


def _status(dash: DashboardApp, approval_id: int) -> str:
    with dash.session() as s:
        appr = s.get(Approval, approval_id)
        assert appr is not None
        return appr.status


def test_viewer_sees_no_buttons_and_gets_403(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "vera")
    page = client.get("/approvals")
    assert page.status_code == 200
    assert f'data-approval="{seeded.approval_id}"' in page.text
    assert "/approve" not in page.text and "Approve</button>" not in page.text
    assert "can see this request but not decide it" in page.text
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve",
        data={"comment": "x"},
        headers={**HX, "X-CSRF-Token": token},
    )
    assert r.status_code == 403
    assert "needs the approver role" in r.headers["X-RLGuard-Reason"]
    assert _status(dash, seeded.approval_id) == "pending"


def test_operator_cannot_approve_either(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "otto")
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve", headers={**HX, "X-CSRF-Token": token}
    )
    assert r.status_code == 403
    assert _status(dash, seeded.approval_id) == "pending"


def test_approve_without_csrf_token_is_rejected(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    login(client, "alice")
    r = client.post(f"/approvals/{seeded.approval_id}/approve", data={"comment": "go"}, headers=HX)
    assert r.status_code == 403
    assert r.headers["X-RLGuard-Reason"] == "CSRF token missing"
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve", headers={**HX, "X-CSRF-Token": "forged"}
    )
    assert r.headers["X-RLGuard-Reason"] == "CSRF token invalid"
    assert _status(dash, seeded.approval_id) == "pending"


def test_approver_approves_and_everything_follows(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "alice")
    page = client.get(f"/approvals/{seeded.approval_id}")
    assert "Approve</button>" in page.text
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve",
        data={"comment": "checkpoint 1200 verified"},
        headers={**HX, "X-CSRF-Token": token},
    )
    assert r.status_code == 200, r.text
    assert 'data-status="approved"' in r.text
    assert "Approved by alice" in r.text and "checkpoint 1200 verified" in r.text
    assert r.headers["HX-Trigger"] == "approval-decided"
    with dash.session() as s:
        appr = s.get(Approval, seeded.approval_id)
        assert appr is not None and appr.status == "approved" and appr.decided_by == "alice"
        restore = s.exec(
            select(RecoveryAction).where(RecoveryAction.action == "restore_checkpoint")
        ).one()
        assert restore.status == "pending"  # released to the dispatcher
        types = [
            e.type
            for e in s.exec(
                select(IncidentEvent).where(IncidentEvent.incident_id == seeded.incident_id)
            )
        ]
        assert types[-1] == "approval_granted"
        audit = s.exec(select(AuditEvent).where(AuditEvent.action == "approval.approve")).one()
        assert audit.actor == "user:alice"
    timeline = client.get(f"/ui/incidents/{seeded.incident_id}/timeline", headers=HX)
    assert 'data-event="Approved"' in timeline.text
    # A decision is final: a second one is refused with the reason.
    again = client.post(
        f"/approvals/{seeded.approval_id}/reject", headers={**HX, "X-CSRF-Token": token}
    )
    assert again.status_code == 409
    assert "already approved by alice" in again.headers["X-RLGuard-Reason"]


def test_reject_cancels_the_plan(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "adam")
    r = client.post(
        f"/approvals/{seeded.approval_id}/reject",
        data={"comment": "storage team is on it"},
        headers={**HX, "X-CSRF-Token": token},
    )
    assert r.status_code == 200
    assert 'data-status="rejected"' in r.text
    with dash.session() as s:
        restore = s.exec(
            select(RecoveryAction).where(RecoveryAction.action == "restore_checkpoint")
        ).one()
        assert restore.status == "cancelled"


def test_plain_form_post_without_htmx_redirects_back(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "alice")
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve",
        data={"csrf_token": token, "comment": "ok"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert r.headers["location"] == f"/approvals/{seeded.approval_id}"
    assert _status(dash, seeded.approval_id) == "approved"


def test_bad_approval_input(client: Browser, dash: DashboardApp) -> None:
    seeded = seed_heavy_incident(dash)
    token = login(client, "alice")
    assert client.get("/approvals/9999").status_code == 404
    r = client.post("/approvals/9999/approve", headers={**HX, "X-CSRF-Token": token})
    assert r.status_code == 404
    assert "no approval with id 9999" in r.headers["X-RLGuard-Reason"]
    r = client.post(
        f"/approvals/{seeded.approval_id}/approve",
        data={"comment": "x" * 2001},
        headers={**HX, "X-CSRF-Token": token},
    )
    assert r.status_code == 422
    assert "at most 2000" in r.headers["X-RLGuard-Reason"]
    assert _status(dash, seeded.approval_id) == "pending"
    assert client.get("/approvals/abc").status_code == 422


def test_queue_partial_and_nav_badge(client: Browser, dash: DashboardApp) -> None:
    seed_heavy_incident(dash)
    login(client, "vera")
    partial = client.get("/ui/approvals/queue", headers=HX)
    assert 'id="approvals-queue"' in partial.text and 'hx-trigger="every' in partial.text
    assert "<html" not in partial.text
    overview = client.get("/")
    assert 'aria-label="1 pending"' in overview.text
