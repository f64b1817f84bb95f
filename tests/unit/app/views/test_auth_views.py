"""Login, logout, session cookie flags, CSRF and redirects of the dashboard."""

from __future__ import annotations

from sqlmodel import select

from app.auth import web as web_auth
from app.auth.users import disable_user, set_password
from app.models import AuditEvent, User
from tests.harness.dashboard import PASSWORD, Browser, DashboardApp, csrf_from, login


def test_pages_redirect_to_login_when_signed_out(client: Browser) -> None:
    r = client.get("/jobs/x?y=1", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/login?next=%2Fjobs%2Fx%3Fy%3D1"


def test_htmx_partial_signed_out_gets_hx_redirect(client: Browser) -> None:
    r = client.get("/ui/overview/health", headers={"HX-Request": "true"}, follow_redirects=False)
    assert r.status_code == 401
    assert r.headers["HX-Redirect"].startswith("/login?next=")


def test_login_sets_hardened_cookies_and_audits(client: Browser, dash: DashboardApp) -> None:
    form = client.get("/login")
    assert form.status_code == 200
    assert "csrf_token" in form.text
    assert form.headers["X-Frame-Options"] == "DENY"
    assert "script-src 'self'" in form.headers["Content-Security-Policy"]
    r = client.post(
        "/login",
        data={
            "username": "alice",
            "password": PASSWORD,
            "csrf_token": csrf_from(form.text),
            "next": "/jobs/a",
        },
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert r.headers["location"] == "/jobs/a"
    cookies = r.headers.get_list("set-cookie")
    session_cookie = next(c for c in cookies if c.startswith(web_auth.SESSION_COOKIE + "="))
    assert "HttpOnly" in session_cookie
    assert "SameSite=lax" in session_cookie
    assert "Secure" not in session_cookie  # plain HTTP here
    with dash.session() as s:
        actions = [e.action for e in s.exec(select(AuditEvent)).all()]
    assert "web.login" in actions


def test_cookies_are_secure_and_host_prefixed_over_https(https_client: Browser) -> None:
    form = https_client.get("/login")
    r = https_client.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": csrf_from(form.text)},
        follow_redirects=False,
    )
    assert r.status_code == 303
    cookies = r.headers.get_list("set-cookie")
    for name in ("__Host-rlguard_session", "__Host-rlguard_csrf"):
        cookie = next(c for c in cookies if c.startswith(name + "="))
        # What browsers demand of a __Host- cookie: Secure, Path=/, no Domain.
        assert "Secure" in cookie and "Path=/" in cookie and "Domain" not in cookie, cookie
    assert not any(c.startswith("rlguard_") for c in cookies)
    assert https_client.get("/settings", follow_redirects=False).status_code == 200


def test_forwarded_proto_from_an_untrusted_peer_does_not_make_cookies_secure(
    client: Browser,
) -> None:
    # No trusted proxy here: the header is anyone's to send, and is ignored.
    form = client.get("/login")
    r = client.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": csrf_from(form.text)},
        headers={"X-Forwarded-Proto": "https"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    session_cookie = next(
        c for c in r.headers.get_list("set-cookie") if c.startswith(web_auth.SESSION_COOKIE + "=")
    )
    assert "Secure" not in session_cookie


def test_wrong_password_is_refused_and_audited(client: Browser, dash: DashboardApp) -> None:
    form = client.get("/login")
    r = client.post(
        "/login",
        data={
            "username": "alice",
            "password": "wrong password",
            "csrf_token": csrf_from(form.text),
        },
        follow_redirects=False,
    )
    assert r.status_code == 401
    assert "Unknown user or wrong password." in r.text
    assert web_auth.SESSION_COOKIE not in client.cookies
    with dash.session() as s:
        failed = s.exec(select(AuditEvent).where(AuditEvent.action == "web.login_failed")).all()
    assert [e.target for e in failed] == ["user:alice"]


def test_unknown_user_and_overlong_name_are_refused(client: Browser) -> None:
    token = csrf_from(client.get("/login").text)
    r = client.post(
        "/login", data={"username": "nobody", "password": "x" * 10, "csrf_token": token}
    )
    assert r.status_code == 401
    r = client.post(
        "/login", data={"username": "n" * 65, "password": "x" * 10, "csrf_token": token}
    )
    assert r.status_code == 401
    assert "at most 64 characters" in r.text


def test_login_without_csrf_token_is_rejected(client: Browser) -> None:
    client.get("/login")  # the browser has its CSRF cookie, but the form field is missing
    r = client.post(
        "/login", data={"username": "alice", "password": PASSWORD}, follow_redirects=False
    )
    assert r.status_code == 403
    assert r.headers["X-RLGuard-Reason"] == "CSRF token missing"
    assert web_auth.SESSION_COOKIE not in client.cookies


def test_csrf_token_from_another_browser_is_rejected(
    client: Browser, other_client: Browser
) -> None:
    foreign = csrf_from(other_client.get("/login").text)
    client.get("/login")
    r = client.post(
        "/login",
        data={"username": "alice", "password": PASSWORD, "csrf_token": foreign},
        follow_redirects=False,
    )
    assert r.status_code == 403
    assert r.headers["X-RLGuard-Reason"] == "CSRF token invalid"


def test_open_redirect_is_not_followed(client: Browser) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        client.cookies.clear()
        form = client.get("/login")
        r = client.post(
            "/login",
            data={
                "username": "alice",
                "password": PASSWORD,
                "csrf_token": csrf_from(form.text),
                "next": target,
            },
            follow_redirects=False,
        )
        assert r.status_code == 303
        assert r.headers["location"] == "/", target


def test_login_rotates_the_csrf_nonce(client: Browser) -> None:
    before = csrf_from(client.get("/login").text)
    after = login(client, "alice")
    assert before != after


def test_logout_needs_csrf_and_ends_the_session(client: Browser, dash: DashboardApp) -> None:
    token = login(client, "otto")
    assert client.post("/logout", follow_redirects=False).status_code == 403
    assert client.get("/settings", follow_redirects=False).status_code == 200
    r = client.post("/logout", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get("/settings", follow_redirects=False).status_code == 303
    with dash.session() as s:
        assert (
            s.exec(select(AuditEvent).where(AuditEvent.action == "web.logout")).first() is not None
        )


def test_tampered_session_cookie_is_treated_as_signed_out(client: Browser) -> None:
    login(client, "vera")
    value = client.cookies[web_auth.SESSION_COOKIE]
    client.cookies.set(web_auth.SESSION_COOKIE, value[:-3] + "AAA")
    assert client.get("/settings", follow_redirects=False).status_code == 303


def test_disabling_a_user_or_changing_the_password_ends_their_sessions(
    client: Browser, dash: DashboardApp
) -> None:
    # Sessions are rows on the server: the users service ends them (a change of the stored
    # hash behind its back no longer does; nothing but the service writes passwords).
    login(client, "vera")
    with dash.session() as s:
        set_password(s, name="vera", password="another long password", actor="test")
        s.commit()
    assert client.get("/settings", follow_redirects=False).status_code == 303
    login(client, "otto")
    with dash.session() as s:
        disable_user(s, name="otto", actor="test")
        s.commit()
    assert client.get("/settings", follow_redirects=False).status_code == 303


def test_role_comes_from_the_database_not_the_cookie(client: Browser, dash: DashboardApp) -> None:
    login(client, "alice")
    assert "approver" in client.get("/settings").text
    with dash.session() as s:
        user = s.exec(select(User).where(User.name == "alice")).one()
        user.role = "viewer"
        s.add(user)
        s.commit()
    page = client.get("/settings").text
    assert '<span class="role-tag">viewer</span>' in page
