"""Server-side dashboard sessions: one ``web_session`` row per signed-in browser.

The browser's cookie holds 256 random bits; the database keeps only their SHA-256, so a copy of
the table signs nobody in. Every request looks the row up (with its user, in one query), so a
logout, a password change or a disabled user takes effect at once on every server replica:
nothing about a session lives in a process's memory.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.models import User, WebSession, utcnow

SESSION_LIFETIME = timedelta(hours=12)
# A cookie longer than this is not one of ours; refused before it reaches the database.
MAX_SESSION_ID_LENGTH = 64


@dataclass(frozen=True, slots=True)
class ActiveSession:
    session_id: int
    user: User


def _hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def start_session(db: Session, *, user: User, client: str, now: datetime | None = None) -> str:
    """Open a session for ``user``; returns the id to put in the cookie (shown only here).

    Also deletes sessions that ended long enough ago to be of no use, so the table stays as
    small as the number of browsers signed in during the last day.
    """
    assert user.id is not None
    now = now or utcnow()
    db.execute(sa.delete(WebSession).where(col(WebSession.expires_at) < now - SESSION_LIFETIME))
    session_id = secrets.token_urlsafe(32)
    db.add(
        WebSession(
            token_hash=_hash(session_id),
            user_id=user.id,
            client=client[:64],
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
        )
    )
    db.flush()
    return session_id


def resolve_session(
    db: Session, session_id: str | None, *, now: datetime | None = None
) -> ActiveSession | None:
    """The live session behind a cookie value, or None (unknown, ended, expired, user disabled)."""
    if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH:
        return None
    row = db.exec(
        select(WebSession, User)
        .join(User, col(User.id) == col(WebSession.user_id))
        .where(WebSession.token_hash == _hash(session_id))
    ).first()
    if row is None:
        return None
    web_session, user = row
    if web_session.revoked_at is not None or user.disabled:
        return None
    if web_session.expires_at <= (now or utcnow()):
        return None
    assert web_session.id is not None
    return ActiveSession(session_id=web_session.id, user=user)


def end_session(db: Session, session_id: str) -> bool:
    """Revoke the session behind a cookie value (logout). True when one was live."""
    result = db.execute(
        sa.update(WebSession)
        .where(col(WebSession.token_hash) == _hash(session_id))
        .where(col(WebSession.revoked_at).is_(None))
        .values(revoked_at=utcnow())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def end_user_sessions(db: Session, user_id: int) -> int:
    """Revoke every live session of a user (password change, disable, delete); how many."""
    result = db.execute(
        sa.update(WebSession)
        .where(col(WebSession.user_id) == user_id)
        .where(col(WebSession.revoked_at).is_(None))
        .values(revoked_at=utcnow())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def delete_user_sessions(db: Session, user_id: int) -> None:
    """Remove a user's session rows (before the user row itself is deleted)."""
    db.execute(sa.delete(WebSession).where(col(WebSession.user_id) == user_id))
