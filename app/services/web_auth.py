"""Browser sessions and CSRF protection for the dashboard.

The session is a cookie the server signs with the settings' secret key (HMAC-SHA256, stdlib
only): ``base64url(json payload) "." base64url(mac)``. It carries the user's id and a short
fingerprint of their password hash, so changing a password (or disabling the user, which the view
checks on every request) ends every open session; the role is re-read from the database on each
request, never trusted from the cookie.

CSRF uses the signed double-submit pattern: a random nonce lives in its own HttpOnly cookie and
the token a form or an htmx request must send back is ``HMAC(secret, "csrf:" + nonce)``. Another
site can neither read the cookie nor compute the token, and the nonce is replaced at login so a
token seen before login is worthless after it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

SESSION_COOKIE = "rlguard_session"
CSRF_COOKIE = "rlguard_csrf"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FORM_FIELD = "csrf_token"
SESSION_MAX_AGE_SECONDS = 12 * 3600


class SessionError(ValueError):
    """A session cookie that is malformed, forged or expired (the message says which)."""


@dataclass(frozen=True, slots=True)
class WebSession:
    user_id: int
    password_tag: str
    issued_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, purpose: str, message: bytes) -> bytes:
    # Keys are separated by purpose so a CSRF token can never be replayed as a session MAC.
    key = hashlib.sha256(f"rlguard-web:{purpose}:{secret}".encode()).digest()
    return hmac.new(key, message, hashlib.sha256).digest()


def password_tag(password_hash: str | None) -> str:
    """A short, non-reversible tag of a password hash; it changes when the password changes."""
    return hashlib.sha256((password_hash or "").encode()).hexdigest()[:16]


def encode_session(secret: str, session: WebSession) -> str:
    payload = json.dumps(
        {"u": session.user_id, "p": session.password_tag, "t": round(session.issued_at, 3)},
        separators=(",", ":"),
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, 'session', payload))}"


def decode_session(
    secret: str,
    value: str,
    *,
    now: float | None = None,
    max_age_seconds: float = SESSION_MAX_AGE_SECONDS,
) -> WebSession:
    """The session in a cookie value; raises :class:`SessionError` when it cannot be trusted."""
    body, sep, mac = value.partition(".")
    if not sep or not body or not mac:
        raise SessionError("session cookie is not of the form payload.signature")
    try:
        payload = _unb64(body)
        given = _unb64(mac)
    except (ValueError, TypeError) as exc:
        raise SessionError("session cookie is not base64url") from exc
    if not hmac.compare_digest(given, _mac(secret, "session", payload)):
        raise SessionError("session cookie signature does not match")
    try:
        data = json.loads(payload)
        session = WebSession(int(data["u"]), str(data["p"]), float(data["t"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise SessionError("session cookie payload is malformed") from exc
    age = (time.time() if now is None else now) - session.issued_at
    if age > max_age_seconds:
        raise SessionError(f"session expired {age - max_age_seconds:.0f}s ago")
    if age < -300:  # issued in the future: another server's clock is badly off, or forged
        raise SessionError("session cookie was issued in the future")
    return session


def new_csrf_nonce() -> str:
    return secrets.token_urlsafe(24)


def csrf_token(secret: str, nonce: str) -> str:
    """The token that pages embed for a browser holding ``nonce`` in its CSRF cookie."""
    return _b64(_mac(secret, "csrf", nonce.encode()))


def csrf_token_valid(secret: str, nonce: str | None, token: str | None) -> bool:
    if not nonce or not token:
        return False
    return hmac.compare_digest(token.encode(), csrf_token(secret, nonce).encode())
