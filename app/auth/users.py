"""Users: creation, password login, lookup by API token, and the lifecycle an admin drives
(disable, enable, new password, delete). Every change is audited, and every change that should
stop someone ends their dashboard sessions at once (app.auth.sessions)."""

from __future__ import annotations

import hashlib
import math
import re

import sqlalchemy as sa
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlmodel import Session, col, select

from app.auth.audit import record_audit
from app.auth.sessions import delete_user_sessions, end_user_sessions
from app.auth.tokens import create_user_token, find_active_token
from app.core.db import begin_write
from app.core.errors import Conflict, InvalidInput, NotFound, TooManyRequests
from app.core.ratelimit import LoginNameThrottle
from app.models import ApiToken, Role, TokenKind, User, utcnow

_USER_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
_hasher = PasswordHasher()
MIN_PASSWORD_LENGTH = 8
MAX_PASSWORD_LENGTH = 1024  # argon2 would hash more, but nobody types more; bounds the CPU cost


def parse_role(value: str) -> Role:
    try:
        return Role(value)
    except ValueError:
        raise InvalidInput(
            f"invalid role {value!r}: choose one of {', '.join(r.value for r in Role)}"
        ) from None


def create_user(
    session: Session,
    *,
    name: str,
    role: Role | str,
    actor: str,
    password: str | None = None,
) -> tuple[User, str]:
    """Create a user and a first API token for it. Returns (user, token plaintext)."""
    if not _USER_NAME_RE.fullmatch(name):
        raise InvalidInput(
            f"invalid user name {name!r}: 1-64 letters, digits and _.@- (not starting with . @ -)"
        )
    role = parse_role(str(role))
    if password is not None:
        check_password(password)
    if session.exec(select(User).where(User.name == name)).first() is not None:
        raise Conflict(f"user {name!r} already exists")
    user = User(
        name=name,
        role=role,
        password_hash=_hasher.hash(password) if password is not None else None,
    )
    session.add(user)
    session.flush()
    record_audit(
        session,
        actor=actor,
        action="user.create",
        target=f"user:{name}",
        detail={"role": role.value, "password": password is not None},
    )
    _token, plaintext = create_user_token(
        session, user=user, actor=actor, description="created with user"
    )
    return user, plaintext


def check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidInput(f"password is shorter than {MIN_PASSWORD_LENGTH} characters")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise InvalidInput(f"password is longer than {MAX_PASSWORD_LENGTH} characters")


def authenticate_password(session: Session, *, name: str, password: str) -> User | None:
    user = session.exec(select(User).where(User.name == name)).first()
    if user is None or user.disabled or user.password_hash is None:
        # Same cost as a real check so response time does not reveal which names exist.
        _hasher.hash(password)
        return None
    try:
        _hasher.verify(user.password_hash, password)
    except (VerificationError, InvalidHashError):
        return None
    return user


def user_for_token(session: Session, plaintext: str) -> User | None:
    token: ApiToken | None = find_active_token(session, plaintext)
    if token is None or token.kind != TokenKind.user or token.user_id is None:
        return None
    user = session.get(User, token.user_id)
    if user is None or user.disabled:
        return None
    return user


def any_admin(session: Session) -> bool:
    return session.exec(select(User).where(User.role == Role.admin)).first() is not None


def find_user(session: Session, name: str) -> User | None:
    return session.exec(select(User).where(User.name == name)).first()


def get_user(session: Session, name: str) -> User:
    user = find_user(session, name)
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def _refuse_removing_last_admin(session: Session, user: User, doing: str) -> None:
    """Someone must remain who can manage users: never disable or delete the last enabled admin.

    The caller took the write lock first (:func:`begin_write`: SQLite's one write lock; the
    enabled admins are locked here on PostgreSQL), so two admins removed at the same time, on
    one server or two, cannot both pass this check.
    """
    if Role(user.role) is not Role.admin or user.disabled:
        return
    admins = session.exec(
        select(User.id)
        .where(User.role == Role.admin)
        .where(col(User.disabled).is_(False))
        .with_for_update()
    ).all()
    if [a for a in admins if a != user.id]:
        return
    raise Conflict(
        f"cannot {doing} user {user.name!r}: it is the last enabled admin "
        "(create or enable another admin first)"
    )


def disable_user(session: Session, *, name: str, actor: str) -> User:
    """Stop a user: their API tokens and dashboard sessions stop working at once."""
    begin_write(session)
    user = get_user(session, name)
    if user.disabled:
        return user
    _refuse_removing_last_admin(session, user, "disable")
    user.disabled = True
    _save_ending_sessions(session, user, actor=actor, action="user.disable")
    return user


def enable_user(session: Session, *, name: str, actor: str) -> User:
    """Let a disabled user in again (their API tokens work again; they sign in anew)."""
    user = get_user(session, name)
    if not user.disabled:
        return user
    user.disabled = False
    session.add(user)
    record_audit(session, actor=actor, action="user.enable", target=f"user:{name}")
    return user


def set_password(
    session: Session, *, name: str, password: str, actor: str, revoke_tokens: bool = False
) -> User:
    """Give a user a new login password; every dashboard session of theirs ends. With
    ``revoke_tokens`` every API token of theirs is revoked too: a password changed because it
    leaked must not leave the tokens issued with it (``POST /auth/token``) working."""
    check_password(password)
    user = get_user(session, name)
    user.password_hash = _hasher.hash(password)
    extra: dict[str, object] = {}
    if revoke_tokens:
        extra["tokens_revoked"] = _revoke_user_tokens(session, user)
    _save_ending_sessions(session, user, actor=actor, action="user.set_password", extra=extra)
    return user


def _revoke_user_tokens(session: Session, user: User) -> list[str]:
    """Revoke the user's active API tokens; their prefixes (never the secrets)."""
    assert user.id is not None
    active = (col(ApiToken.user_id) == user.id) & col(ApiToken.revoked_at).is_(None)
    prefixes = list(session.exec(select(ApiToken.prefix).where(active)).all())
    session.execute(sa.update(ApiToken).where(active).values(revoked_at=utcnow()))
    return prefixes


def _save_ending_sessions(
    session: Session, user: User, *, actor: str, action: str, extra: dict[str, object] | None = None
) -> None:
    """Store a change that must sign the user out everywhere, end their sessions, audit both."""
    session.add(user)
    assert user.id is not None
    ended = end_user_sessions(session, user.id)
    record_audit(
        session,
        actor=actor,
        action=action,
        target=f"user:{user.name}",
        detail={"sessions_ended": ended, **(extra or {})},
    )


def delete_user(session: Session, *, name: str, actor: str) -> None:
    """Remove a user with their tokens and sessions (the audit log keeps what they did)."""
    begin_write(session)
    user = get_user(session, name)
    _refuse_removing_last_admin(session, user, "delete")
    assert user.id is not None
    tokens = session.exec(select(ApiToken.prefix).where(ApiToken.user_id == user.id)).all()
    session.execute(sa.delete(ApiToken).where(col(ApiToken.user_id) == user.id))
    delete_user_sessions(session, user.id)
    session.delete(user)
    record_audit(
        session,
        actor=actor,
        action="user.delete",
        target=f"user:{name}",
        detail={"role": str(user.role), "tokens_deleted": list(tokens)},
    )


def throttle_login_name(throttle: LoginNameThrottle, name: str, client: str) -> None:
    """Take one login attempt from ``name``'s budget, or refuse with 429; an address with no
    failed attempt for the name passes even an empty budget (app.core.ratelimit), so others'
    wrong guesses cannot lock the user out. A failed attempt is noted with ``throttle.failed``.
    """
    wait = throttle.acquire(name, client)
    if wait > 0:
        retry_after = max(1, math.ceil(wait))
        raise TooManyRequests(
            f"too many login attempts for this user name; retry in {retry_after} s",
            retry_after=retry_after,
        )


def name_for_log(session: Session, name: str) -> str:
    """A failed login's user name as logs and the audit log may keep it.

    An existing user's name is shown; anything else is replaced by a short hash, because a
    name that matches no user is often a password typed into the wrong field. The same
    mistyped value always gives the same hash, so repeated attempts still line up.
    """
    if find_user(session, name) is not None:
        return name
    return "unknown-" + hashlib.sha256(name.encode()).hexdigest()[:12]
