"""CSRF tokens bound to a session or a pre-login nonce, and cookie names (app.auth.web)."""

from __future__ import annotations

from app.auth import web as web_auth

SECRET = "unit-test-secret-key-0123456789"


def test_csrf_token_is_valid_only_for_its_binding() -> None:
    mine = web_auth.session_binding("session-a")
    token = web_auth.csrf_token(SECRET, mine)
    assert web_auth.csrf_token_valid(SECRET, mine, token)
    # Another session, the same string as a pre-login nonce, another secret: all refused.
    assert not web_auth.csrf_token_valid(SECRET, web_auth.session_binding("session-b"), token)
    assert not web_auth.csrf_token_valid(SECRET, web_auth.nonce_binding("session-a"), token)
    assert not web_auth.csrf_token_valid("x" * 32, mine, token)
    assert not web_auth.csrf_token_valid(SECRET, None, token)
    assert not web_auth.csrf_token_valid(SECRET, mine, None)
    assert not web_auth.csrf_token_valid(SECRET, mine, "")


def test_cookie_names_take_the_host_prefix_only_over_https() -> None:
    assert web_auth.session_cookie_name(True) == "__Host-rlguard_session"
    assert web_auth.csrf_cookie_name(True) == "__Host-rlguard_csrf"
    assert web_auth.session_cookie_name(False) == "rlguard_session"
    assert web_auth.csrf_cookie_name(False) == "rlguard_csrf"
