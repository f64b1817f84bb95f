"""Signing in to the dashboard: check a name and password (the users service), audit the attempt."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlmodel import Session

from app.services import web_auth
from app.services.audit import record_audit
from app.services.users import authenticate_password

log = logging.getLogger("rlguard.views.auth")

MAX_NAME_LENGTH = 64
MAX_PASSWORD_LENGTH = 1024  # argon2 would hash more, but nobody types more; bounds the CPU cost


class LoginRefused(ValueError):
    """Sign-in failed; the message is safe to show (it never says which of the two was wrong)."""


@dataclass(frozen=True, slots=True)
class SignedIn:
    user_id: int
    name: str
    role: str
    password_tag: str


def sign_in(session: Session, *, name: str, password: str, client: str) -> SignedIn:
    """The user, if ``password`` is theirs; every attempt, good or bad, is audited."""
    name = name.strip()
    if not name or not password:
        raise LoginRefused("Enter both a user name and a password.")
    if len(name) > MAX_NAME_LENGTH:
        raise LoginRefused(f"User names are at most {MAX_NAME_LENGTH} characters.")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise LoginRefused(f"Passwords are at most {MAX_PASSWORD_LENGTH} characters.")
    user = authenticate_password(session, name=name, password=password)
    if user is None or user.id is None:
        record_audit(
            session, actor=f"web:{client}", action="web.login_failed", target=f"user:{name}"
        )
        session.commit()
        log.info("dashboard sign-in refused for %r from %s", name, client)
        raise LoginRefused("Unknown user or wrong password.")
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="web.login",
        target=f"user:{user.name}",
        detail={"client": client},
    )
    session.commit()
    return SignedIn(
        user_id=user.id,
        name=user.name,
        role=str(user.role),
        password_tag=web_auth.password_tag(user.password_hash),
    )


def record_logout(session: Session, *, name: str) -> None:
    record_audit(session, actor=f"user:{name}", action="web.logout", target=f"user:{name}")
    session.commit()
