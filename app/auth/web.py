"""Dashboard cookies and CSRF protection.

The session cookie holds a random id of a server-side session (``app.auth.sessions``); nothing
in it is trusted beyond looking that row up.

CSRF tokens are ``HMAC(secret, binding)``. Once signed in, the binding is the browser's session
id, so a token is worth something only together with that session's cookie: a token taken from
another session (another user's, or the same user's other browser) is refused. Before sign-in
(the login form) there is no session yet; the binding is then a random nonce in its own
HttpOnly cookie (signed double-submit), replaced at login.

Cookie names: over HTTPS (directly, or behind a trusted proxy that says so) the cookies are
named with the ``__Host-`` prefix, which browsers accept only with ``Secure``, ``Path=/`` and no
``Domain``: no other site and no subdomain can set or overwrite them. Plain-HTTP local
development cannot use the prefix (browsers refuse it without ``Secure``), so there the names
are unprefixed; a server reads only the names that match the request's scheme.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SESSION_COOKIE = "rlguard_session"
CSRF_COOKIE = "rlguard_csrf"
SECURE_PREFIX = "__Host-"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FORM_FIELD = "csrf_token"
SESSION_MAX_AGE_SECONDS = 12 * 3600
MAX_NONCE_LENGTH = 64


def session_cookie_name(secure: bool) -> str:
    return SECURE_PREFIX + SESSION_COOKIE if secure else SESSION_COOKIE


def csrf_cookie_name(secure: bool) -> str:
    return SECURE_PREFIX + CSRF_COOKIE if secure else CSRF_COOKIE


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _mac(secret: str, purpose: str, message: bytes) -> bytes:
    # Keys are separated by purpose so a MAC made for one use is worthless for another.
    key = hashlib.sha256(f"rlguard-web:{purpose}:{secret}".encode()).digest()
    return hmac.new(key, message, hashlib.sha256).digest()


def new_csrf_nonce() -> str:
    return secrets.token_urlsafe(24)


def session_binding(session_id: str) -> str:
    return "session:" + session_id


def nonce_binding(nonce: str) -> str:
    return "nonce:" + nonce


def csrf_token(secret: str, binding: str) -> str:
    """The token that pages embed for a browser whose session (or nonce) is ``binding``."""
    return _b64(_mac(secret, "csrf", binding.encode()))


def csrf_token_valid(secret: str, binding: str | None, token: str | None) -> bool:
    if not binding or not token:
        return False
    return hmac.compare_digest(token.encode(), csrf_token(secret, binding).encode())
