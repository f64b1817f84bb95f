"""Users, roles and API tokens (only a hash of a token is stored)."""

from __future__ import annotations

import enum
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from app.models._types import UTCDateTime, utcnow


class Role(enum.StrEnum):
    viewer = "viewer"
    operator = "operator"
    approver = "approver"
    admin = "admin"

    @property
    def level(self) -> int:
        return _ROLE_LEVEL[self]

    def allows(self, required: Role) -> bool:
        """True when this role is at least ``required`` (viewer < operator < approver < admin)."""
        return self.level >= required.level


_ROLE_LEVEL = {Role.viewer: 0, Role.operator: 1, Role.approver: 2, Role.admin: 3}


class TokenKind(enum.StrEnum):
    node = "node"
    user = "user"


class User(SQLModel, table=True):
    __tablename__ = "user_account"  # "user" is reserved in PostgreSQL

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True, index=True)
    role: Role = Field(sa_type=sa.String(16))
    # argon2id hash; None for API-only users (created without a password).
    password_hash: str | None = Field(default=None, max_length=256)
    disabled: bool = False
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ApiToken(SQLModel, table=True):
    """A bearer token: for a node agent (ingest) or for a user (REST API).

    Tokens are 256 random bits, so a plain SHA-256 is the right hash (a slow password hash would
    only slow down every request); ``prefix`` identifies a token in lists without revealing it.
    """

    __tablename__ = "api_token"

    id: int | None = Field(default=None, primary_key=True)
    kind: TokenKind = Field(sa_type=sa.String(8))
    token_hash: str = Field(max_length=64, unique=True, index=True)
    prefix: str = Field(max_length=16)
    node_name: str | None = Field(default=None, max_length=128, foreign_key="node.name")
    user_id: int | None = Field(default=None, foreign_key="user_account.id", index=True)
    description: str = Field(default="", max_length=200)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # A node token's job scope: glob patterns (``team-a-*``) every job it reports must match;
    # None is unscoped (any job). ``app.auth.job_scope`` checks and enforces them.
    job_patterns: list[str] | None = Field(default=None, sa_type=sa.JSON)


class WebSession(SQLModel, table=True):
    """A signed-in dashboard browser. The cookie holds a random id; only its SHA-256 is stored.

    A row is the whole truth of a session, so every server replica sees a logout, a password
    change or a disabled user at once: the session stops when ``revoked_at`` is set or
    ``expires_at`` passes.
    """

    __tablename__ = "web_session"

    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(max_length=64, unique=True, index=True)
    user_id: int = Field(foreign_key="user_account.id", index=True)
    client: str = Field(default="", max_length=64)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    expires_at: datetime = Field(sa_type=UTCDateTime, index=True)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
