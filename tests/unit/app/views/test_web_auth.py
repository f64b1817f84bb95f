"""Session cookie signing and CSRF tokens (app.services.web_auth)."""

from __future__ import annotations

import pytest

from app.services import web_auth
from app.services.web_auth import SessionError, WebSession

SECRET = "s" * 32


def test_session_round_trip() -> None:
    s = WebSession(user_id=7, password_tag="abcd", issued_at=1000.0)
    cookie = web_auth.encode_session(SECRET, s)
    assert web_auth.decode_session(SECRET, cookie, now=1001.0) == s


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda c: c.replace(".", "", 1), "not of the form"),
        (lambda c: "A" + c[1:], "signature does not match"),
        (lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"), "signature does not match"),
        (lambda c: "%%%." + c.split(".")[1], "base64url|signature"),
    ],
)
def test_tampered_session_is_refused(mutate, reason) -> None:
    cookie = web_auth.encode_session(SECRET, WebSession(1, "t", 1000.0))
    with pytest.raises(SessionError, match=reason):
        web_auth.decode_session(SECRET, mutate(cookie), now=1000.0)


def test_session_signed_with_another_secret_is_refused() -> None:
    cookie = web_auth.encode_session("other-secret-" * 3, WebSession(1, "t", 1000.0))
    with pytest.raises(SessionError, match="signature"):
        web_auth.decode_session(SECRET, cookie, now=1000.0)


def test_expired_and_future_sessions_are_refused() -> None:
    cookie = web_auth.encode_session(SECRET, WebSession(1, "t", 1000.0))
    with pytest.raises(SessionError, match="expired"):
        web_auth.decode_session(SECRET, cookie, now=1000.0 + web_auth.SESSION_MAX_AGE_SECONDS + 1)
    with pytest.raises(SessionError, match="future"):
        web_auth.decode_session(SECRET, cookie, now=1000.0 - 3600)


def test_csrf_token_is_bound_to_nonce_and_secret() -> None:
    token = web_auth.csrf_token(SECRET, "nonce-1")
    assert web_auth.csrf_token_valid(SECRET, "nonce-1", token)
    assert not web_auth.csrf_token_valid(SECRET, "nonce-2", token)
    assert not web_auth.csrf_token_valid("x" * 32, "nonce-1", token)
    assert not web_auth.csrf_token_valid(SECRET, None, token)
    assert not web_auth.csrf_token_valid(SECRET, "nonce-1", None)
    assert not web_auth.csrf_token_valid(SECRET, "nonce-1", "")


def test_csrf_token_is_not_a_valid_session_mac() -> None:
    # Purpose-separated keys: a CSRF token for nonce N is not the session MAC of payload N.
    payload = b'{"u":1,"p":"t","t":1000.0}'
    forged = f"{web_auth._b64(payload)}.{web_auth.csrf_token(SECRET, payload.decode())}"
    with pytest.raises(SessionError, match="signature"):
        web_auth.decode_session(SECRET, forged, now=1000.0)


def test_password_tag_changes_with_the_hash() -> None:
    assert web_auth.password_tag("hash-a") != web_auth.password_tag("hash-b")
    assert web_auth.password_tag("hash-a") == web_auth.password_tag("hash-a")
