"""Sessions and users that can be stopped (issue 17 item 2), across two replicas of one database.

A copied cookie dies with its session's logout; a password change, a disable and a delete end a
user's sessions and (disable, delete) their API tokens at once, on every replica; every change
is audited; the last enabled admin cannot be removed; bad input changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.models import Role
from tests.harness import Api, auth
from tests.harness.dashboard import PASSWORD
from tests.integration.auth._browser import Browser, add_user

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NEW_PASSWORD = "a brand new long password"


def audit_rows(api: Api, action_prefix: str) -> list[tuple[str, str, str]]:
    with Session(api.engine) as s:
        rows = s.execute(
            sa.text(
                "SELECT actor, action, target FROM audit_event WHERE action LIKE :p ORDER BY id"
            ),
            {"p": action_prefix + "%"},
        ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def user_state(api: Api, name: str) -> tuple[bool, str | None] | None:
    with Session(api.engine) as s:
        row = s.execute(
            sa.text("SELECT disabled, password_hash FROM user_account WHERE name = :n"),
            {"n": name},
        ).first()
    return None if row is None else (bool(row[0]), row[1])


def test_a_copied_cookie_stops_working_at_logout_on_every_replica(
    make_replica: Callable[..., Api],
) -> None:
    one, two = make_replica(), make_replica()
    add_user(one, "vera", Role.viewer)
    browser = Browser(one)
    assert browser.login("vera").status_code == 303
    # The attacker's copy of the cookies, used against the other replica.
    stolen = browser.on(two, share=False)
    assert stolen.signed_in()
    token = browser.csrf()
    assert browser.post("/logout", data={"csrf_token": token}).status_code == 303
    assert not browser.signed_in()
    assert stolen.cookies, "the copy still holds the old session cookie"
    assert not stolen.signed_in()
    htmx = stolen.get("/ui/overview/health", headers={"HX-Request": "true"})
    assert htmx.status_code == 401 and htmx.headers["HX-Redirect"].startswith("/login")
    assert not stolen.on(one, share=False).signed_in()


def test_disable_stops_tokens_and_sessions_at_once_and_enable_restores(
    make_replica: Callable[..., Api],
) -> None:
    one, two = make_replica(), make_replica()
    admin = add_user(one, "root", Role.admin)
    otto_token = add_user(one, "otto", Role.operator)
    browser = Browser(one)
    assert browser.login("otto").status_code == 303
    assert two.client.get("/api/v1/me", headers=auth(otto_token)).status_code == 200

    r = one.client.post("/api/v1/users/otto/disable", headers=auth(admin))
    assert r.status_code == 200 and r.json()["disabled"] is True
    # On the other replica too, with no cache to wait for.
    assert two.client.get("/api/v1/me", headers=auth(otto_token)).status_code == 401
    assert not browser.on(two).signed_in()
    assert browser.login("otto").status_code == 401  # a disabled user cannot sign in again
    login = two.client.post("/api/v1/auth/token", json={"name": "otto", "password": PASSWORD})
    assert login.status_code == 401

    r = two.client.post("/api/v1/users/otto/enable", headers=auth(admin))
    assert r.status_code == 200 and r.json()["disabled"] is False
    assert one.client.get("/api/v1/me", headers=auth(otto_token)).status_code == 200
    assert browser.login("otto").status_code == 303 and browser.signed_in()
    assert audit_rows(one, "user.") == [
        ("test", "user.create", "user:root"),
        ("test", "user.create", "user:otto"),
        ("user:root", "user.disable", "user:otto"),
        ("user:root", "user.enable", "user:otto"),
    ]


def test_set_password_ends_sessions_and_only_the_new_password_works(
    make_replica: Callable[..., Api],
) -> None:
    one, two = make_replica(), make_replica()
    admin = add_user(one, "root", Role.admin)
    add_user(one, "alice", Role.approver)
    laptop, phone = Browser(one), Browser(two)
    assert laptop.login("alice").status_code == 303
    assert phone.login("alice").status_code == 303
    r = two.client.request(
        "PUT",
        "/api/v1/users/alice/password",
        json={"password": NEW_PASSWORD},
        headers=auth(admin),
    )
    assert r.status_code == 200, r.text
    assert not laptop.signed_in() and not phone.signed_in()
    assert laptop.login("alice").status_code == 401
    assert laptop.login("alice", NEW_PASSWORD).status_code == 303
    assert ("user:root", "user.set_password", "user:alice") in audit_rows(one, "user.")


def test_delete_removes_user_tokens_and_sessions_but_never_the_last_admin(
    make_replica: Callable[..., Api],
) -> None:
    api = make_replica()
    root = add_user(api, "root", Role.admin)
    vic_token = add_user(api, "vic", Role.viewer)
    browser = Browser(api)
    assert browser.login("vic").status_code == 303

    r = api.client.delete("/api/v1/users/root", headers=auth(root))
    assert r.status_code == 409
    assert "last enabled admin" in r.json()["detail"] and "'root'" in r.json()["detail"]
    r = api.client.post("/api/v1/users/root/disable", headers=auth(root))
    assert r.status_code == 409 and "last enabled admin" in r.json()["detail"]
    assert user_state(api, "root") is not None and user_state(api, "root")[0] is False  # type: ignore[index]

    assert api.client.delete("/api/v1/users/vic", headers=auth(root)).status_code == 204
    assert user_state(api, "vic") is None
    assert api.client.get("/api/v1/me", headers=auth(vic_token)).status_code == 401
    assert not browser.signed_in()
    with Session(api.engine) as s:
        left = s.execute(sa.text("SELECT count(*) FROM web_session")).scalar_one()
    assert left == 0
    assert ("user:root", "user.delete", "user:vic") in audit_rows(api, "user.")

    # With a second enabled admin, the first may go.
    add_user(api, "root2", Role.admin)
    assert api.client.delete("/api/v1/users/root", headers=auth(root)).status_code == 204


def test_bad_input_is_refused_by_name_and_changes_nothing(make_replica: Callable[..., Api]) -> None:
    api = make_replica()
    admin = add_user(api, "root", Role.admin)
    viewer = add_user(api, "vera", Role.viewer)
    before = user_state(api, "vera")
    audit_before = audit_rows(api, "")
    cases = [
        ("POST", "/api/v1/users/nobody/disable", None, admin, 404, "'nobody'"),
        ("POST", "/api/v1/users/nobody/enable", None, admin, 404, "'nobody'"),
        ("DELETE", "/api/v1/users/nobody", None, admin, 404, "'nobody'"),
        ("PUT", "/api/v1/users/vera/password", {"password": "short"}, admin, 422, "shorter"),
        ("PUT", "/api/v1/users/vera/password", {"password": "x" * 2000}, admin, 422, "longer"),
        ("PUT", "/api/v1/users/vera/password", {}, admin, 422, "password"),
        ("POST", "/api/v1/users/" + "n" * 65 + "/disable", None, admin, 422, "64"),
        ("POST", "/api/v1/users/root/disable", None, viewer, 403, "admin role"),
        ("DELETE", "/api/v1/users/root", None, viewer, 403, "admin role"),
        ("PUT", "/api/v1/users/root/password", {"password": NEW_PASSWORD}, viewer, 403, "admin"),
    ]
    for method, path, body, token, status, reason in cases:
        r = api.client.request(method, path, json=body, headers=auth(token))
        assert r.status_code == status, (method, path, r.status_code, r.text)
        assert reason in r.text, (method, path, r.text)
    assert user_state(api, "vera") == before
    assert audit_rows(api, "") == audit_before
