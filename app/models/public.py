"""Shapes the REST API returns (never table rows directly)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from app.models.auth import Role


class NodePublic(BaseModel):
    name: str
    created_at: datetime
    last_seen_at: datetime | None
    last_seen_age_seconds: float | None
    last_agent_id: str | None
    fingerprint_hash: str | None
    series: int


class SeriesLatest(BaseModel):
    name: str
    labels: dict[str, str]
    ts: float
    value: float


class ParticipantPublic(BaseModel):
    job: str
    role: str
    rank: int
    node: str | None
    phase: str
    step: int
    last_heartbeat_at: datetime
    heartbeat_age_seconds: float


class NodeDetail(NodePublic):
    fingerprint: dict[str, str] | None
    latest: list[SeriesLatest]
    participants: list[ParticipantPublic]


class NodesPublic(BaseModel):
    data: list[NodePublic]
    count: int


class JobPublic(BaseModel):
    name: str
    created_at: datetime
    last_seen_at: datetime | None
    participants: int
    phases: dict[str, int]


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class JobDetail(JobPublic):
    participant_list: list[ParticipantPublic]


class SeriesPoints(BaseModel):
    node: str
    name: str
    labels: dict[str, str]
    points: list[tuple[float, float]]


class SeriesList(BaseModel):
    data: list[SeriesPoints]
    count: int
    truncated: bool


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


class IngestAck(BaseModel):
    accepted: int
    duplicate: bool


class AuditEventPublic(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, object]
