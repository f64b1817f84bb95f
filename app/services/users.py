"""Users: creation, password login, lookup by API token."""

from __future__ import annotations

import re

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlmodel import Session, select

from app.models import ApiToken, Role, TokenKind, User
from app.services.audit import record_audit
from app.services.errors import Conflict, InvalidInput
from app.services.tokens import create_user_token, find_active_token

_USER_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
_hasher = PasswordHasher()
MIN_PASSWORD_LENGTH = 8


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
    if password is not None and len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidInput(f"password is shorter than {MIN_PASSWORD_LENGTH} characters")
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
