"""The REST API's shapes of nodes, jobs, participants, series and phase history (never table
rows directly)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel


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


class PhaseTransitionPublic(BaseModel):
    role: str
    rank: int
    node: str | None
    phase: str
    previous_phase: str | None
    step: int
    at: datetime


class PhaseHistoryPublic(BaseModel):
    job: str
    since: datetime
    data: list[PhaseTransitionPublic]
    count: int
    truncated: bool
