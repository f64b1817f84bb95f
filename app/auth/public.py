"""The REST API's shapes of users, tokens, logins and audit events (never table rows directly)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from app.models.auth import Role


class UserPublic(BaseModel):
    id: int
    name: str
    role: Role
    disabled: bool
    created_at: datetime


class UserCreate(BaseModel):
    name: str
    role: Role
    password: str | None = None


class PasswordSet(BaseModel):
    password: str
    # Also revoke every API token of the user (a password changed because it leaked).
    revoke_tokens: bool = False


class UserCreated(BaseModel):
    user: UserPublic
    token: str


class TokenPublic(BaseModel):
    id: int
    kind: str
    prefix: str
    node: str | None
    user_id: int | None
    description: str
    created_at: datetime
    revoked_at: datetime | None
    # A node token's job scope (glob patterns); null: any job.
    jobs: list[str] | None = None


class NodeTokenCreate(BaseModel):
    node: str
    description: str = ""
    # Glob patterns (``team-a-*``) of the jobs this node may report; omitted: any job.
    jobs: list[str] | None = None


class TokenCreated(BaseModel):
    token: str
    info: TokenPublic


class LoginRequest(BaseModel):
    name: str
    password: str


class AuditEventPublic(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, object]
