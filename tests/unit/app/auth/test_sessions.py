"""Server-side dashboard sessions (app.auth.sessions) on SQLite: expiry, revocation, cleanup."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, select

from app.auth import sessions
from app.core.db import make_engine
from app.core.migrate import upgrade
from app.models import Role, User, WebSession, utcnow


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Session]:
    url = f"sqlite:///{tmp_path / 'rlguard.db'}"
    upgrade(url)
    engine = make_engine(url)
    with Session(engine, expire_on_commit=False) as s:
        s.add(User(name="vera", role=Role.viewer))
        s.commit()
        yield s
    engine.dispose()


def vera(db: Session) -> User:
    return db.exec(select(User).where(User.name == "vera")).one()


def test_a_session_lives_its_lifetime_and_no_longer(db: Session) -> None:
    start = utcnow()
    sid = sessions.start_session(db, user=vera(db), client="192.0.2.1", now=start)
    db.commit()
    assert sessions.resolve_session(db, sid, now=start) is not None
    late = start + sessions.SESSION_LIFETIME
    assert sessions.resolve_session(db, sid, now=late - timedelta(seconds=1)) is not None
    assert sessions.resolve_session(db, sid, now=late) is None


def test_only_the_hash_is_stored_and_odd_cookies_are_nobody(db: Session) -> None:
    sid = sessions.start_session(db, user=vera(db), client="x")
    db.commit()
    stored = db.exec(select(WebSession.token_hash)).all()
    assert sid not in stored and len(stored[0]) == 64
    for cookie in (None, "", "x" * 65, sid[:-1]):
        assert sessions.resolve_session(db, cookie) is None


def test_end_session_and_end_user_sessions(db: Session) -> None:
    user = vera(db)
    a = sessions.start_session(db, user=user, client="a")
    b = sessions.start_session(db, user=user, client="b")
    assert sessions.end_session(db, a) is True
    assert sessions.end_session(db, a) is False  # already ended
    assert sessions.resolve_session(db, a) is None and sessions.resolve_session(db, b) is not None
    assert user.id is not None and sessions.end_user_sessions(db, user.id) == 1
    assert sessions.resolve_session(db, b) is None


def test_a_disabled_user_has_no_session(db: Session) -> None:
    user = vera(db)
    sid = sessions.start_session(db, user=user, client="a")
    user.disabled = True
    db.add(user)
    db.flush()
    assert sessions.resolve_session(db, sid) is None


def test_long_dead_sessions_are_swept_at_the_next_sign_in(db: Session) -> None:
    old = utcnow() - 3 * sessions.SESSION_LIFETIME
    sessions.start_session(db, user=vera(db), client="old", now=old)
    sessions.start_session(db, user=vera(db), client="new")
    db.commit()
    assert db.exec(select(WebSession.client)).all() == ["new"]
