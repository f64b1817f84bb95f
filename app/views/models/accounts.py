"""Signing in to the dashboard: check a name and password (the users service), open a
server-side session (app.auth.sessions), audit the attempt; signing out ends that session."""

from __future__ import annotations

import logging

from sqlmodel import Session

from app.auth import sessions
from app.auth.audit import record_audit
from app.auth.users import (
    MAX_PASSWORD_LENGTH,
    authenticate_password,
    name_for_log,
    throttle_login_name,
)
from app.core.ratelimit import LoginNameThrottle

log = logging.getLogger("rlguard.views.auth")

MAX_NAME_LENGTH = 64


class LoginRefused(ValueError):
    """Sign-in failed; the message is safe to show (it never says which of the two was wrong)."""


def sign_in(
    session: Session, *, name: str, password: str, client: str, throttle: LoginNameThrottle
) -> str:
    """A new session id for the user, if ``password`` is theirs; every attempt is audited.

    Raises :class:`LoginRefused`, or ``TooManyRequests`` when this user name has used up its
    login attempts (from any address; the per-address limit is the middleware's).
    """
    name = name.strip()
    if not name or not password:
        raise LoginRefused("Enter both a user name and a password.")
    if len(name) > MAX_NAME_LENGTH:
        raise LoginRefused(f"User names are at most {MAX_NAME_LENGTH} characters.")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise LoginRefused(f"Passwords are at most {MAX_PASSWORD_LENGTH} characters.")
    throttle_login_name(throttle, name, client)
    user = authenticate_password(session, name=name, password=password)
    if user is None or user.id is None:
        throttle.failed(name, client)
        shown = name_for_log(session, name)
        record_audit(
            session, actor=f"web:{client}", action="web.login_failed", target=f"user:{shown}"
        )
        session.commit()
        log.info("dashboard sign-in refused for %s from %s", shown, client)
        raise LoginRefused("Unknown user or wrong password.")
    session_id = sessions.start_session(session, user=user, client=client)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="web.login",
        target=f"user:{user.name}",
        detail={"client": client},
    )
    session.commit()
    return session_id


def sign_out(session: Session, *, session_id: str, name: str) -> None:
    sessions.end_session(session, session_id)
    record_audit(session, actor=f"user:{name}", action="web.logout", target=f"user:{name}")
    session.commit()
