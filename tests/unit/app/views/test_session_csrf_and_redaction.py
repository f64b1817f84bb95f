"""CSRF tokens bound to the session (issue 17 item 11) and what failed sign-ins leave in the
logs and the audit log, and what the settings page shows of on-call phone numbers (item 12)."""

from __future__ import annotations

import logging

import pytest
from sqlmodel import select

from app.auth import web as web_auth
from app.models import AuditEvent
from tests.harness.dashboard import Browser, DashboardApp, csrf_from, login


def test_a_csrf_token_from_another_session_is_refused(
    client: Browser, other_client: Browser
) -> None:
    mine = login(client, "adam")
    theirs = login(other_client, "otto")
    r = client.post("/logout", data={"csrf_token": theirs}, follow_redirects=False)
    assert r.status_code == 403 and r.headers["X-RLGuard-Reason"] == "CSRF token invalid"
    # Not even the same user's token from their other browser.
    login(other_client, "adam")
    other_adam = csrf_from(other_client.get("/settings").text)
    assert other_adam != mine
    r = client.post("/logout", data={"csrf_token": other_adam}, follow_redirects=False)
    assert r.status_code == 403
    assert client.get("/settings", follow_redirects=False).status_code == 200
    assert (
        client.post("/logout", data={"csrf_token": mine}, follow_redirects=False).status_code == 303
    )


def test_a_planted_csrf_cookie_with_its_own_token_does_not_pass_for_a_session(
    client: Browser, other_client: Browser, dash: DashboardApp
) -> None:
    """The attack binding to the session stops: someone who can set a cookie for this site (a
    sibling subdomain, plain-HTTP injection) plants their own nonce and sends its token."""
    login(client, "adam")
    attacker_token = csrf_from(other_client.get("/login").text)
    attacker_nonce = other_client.cookies[web_auth.CSRF_COOKIE]
    # A valid pair: bound to a nonce, as before this change every token was.
    assert web_auth.csrf_token_valid(
        dash.settings.secret_key, web_auth.nonce_binding(attacker_nonce), attacker_token
    )
    client.cookies.set(web_auth.CSRF_COOKIE, attacker_nonce, domain="testserver.local")
    r = client.post("/logout", data={"csrf_token": attacker_token}, follow_redirects=False)
    assert r.status_code == 403 and r.headers["X-RLGuard-Reason"] == "CSRF token invalid"
    assert client.get("/settings", follow_redirects=False).status_code == 200


def test_a_csrf_token_dies_with_its_session(client: Browser) -> None:
    old = login(client, "adam")
    assert (
        client.post("/logout", data={"csrf_token": old}, follow_redirects=False).status_code == 303
    )
    new = login(client, "adam")
    assert new != old
    r = client.post("/logout", data={"csrf_token": old}, follow_redirects=False)
    assert r.status_code == 403


def test_a_name_that_is_no_user_is_never_logged_as_typed(
    client: Browser, dash: DashboardApp, caplog: pytest.LogCaptureFixture
) -> None:
    typed = "Hunter2-Secret-Pass"  # a password typed into the name field
    token = csrf_from(client.get("/login").text)
    with caplog.at_level(logging.DEBUG):
        for name in (typed, "alice"):
            r = client.post(
                "/login", data={"username": name, "password": "wrong-pw", "csrf_token": token}
            )
            assert r.status_code == 401
    text = caplog.text
    assert typed not in text and typed.lower() not in text.lower()
    assert "unknown-" in text  # a short hash stands in for it, the same each time
    assert "alice" in text  # an existing user's name is no secret
    with dash.session() as s:
        targets = [
            e.target
            for e in s.exec(select(AuditEvent).where(AuditEvent.action == "web.login_failed"))
        ]
    assert len(targets) == 2 and targets[1] == "user:alice"
    assert targets[0].startswith("user:unknown-") and typed not in targets[0]
