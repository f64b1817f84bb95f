"""Read-side queries for nodes, jobs and series (shared by the REST API and the dashboard)."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

from sqlmodel import Session, func, select

from app.auth.public import AuditEventPublic, TokenPublic, UserPublic
from app.cluster.public import (
    JobDetail,
    JobPublic,
    NodeDetail,
    NodePublic,
    ParticipantPublic,
    SeriesLatest,
    SeriesPoints,
)
from app.core.errors import InvalidInput, NotFound
from app.models import ApiToken, AuditEvent, Job, Node, Participant, User
from app.series.store import SeriesStore


def _age(at: datetime | None, now: float) -> float | None:
    return None if at is None else max(0.0, now - at.timestamp())


def _node_public(node: Node, store: SeriesStore, now: float) -> NodePublic:
    return NodePublic(
        name=node.name,
        created_at=node.created_at,
        last_seen_at=node.last_seen_at,
        last_seen_age_seconds=_age(node.last_seen_at, now),
        last_agent_id=node.last_agent_id,
        fingerprint_hash=node.fingerprint_hash,
        series=len(store.keys(node=node.name)),
    )


def _participant_public(p: Participant, now: float) -> ParticipantPublic:
    return ParticipantPublic(
        job=p.job_name,
        role=p.role,
        rank=p.rank,
        node=p.node_name,
        phase=p.phase,
        step=p.step,
        last_heartbeat_at=p.last_heartbeat_at,
        heartbeat_age_seconds=_age(p.last_heartbeat_at, now) or 0.0,
    )


def list_nodes(
    session: Session, *, store: SeriesStore, now: float | None = None
) -> list[NodePublic]:
    now = time.time() if now is None else now
    nodes = session.exec(select(Node).order_by(Node.name)).all()
    return [_node_public(n, store, now) for n in nodes]


def node_detail(
    session: Session, *, name: str, store: SeriesStore, now: float | None = None
) -> NodeDetail:
    now = time.time() if now is None else now
    node = session.exec(select(Node).where(Node.name == name)).first()
    if node is None:
        raise NotFound(f"no node named {name!r}")
    latest = []
    for key in sorted(store.keys(node=name), key=lambda k: (k.name, k.labels)):
        point = store.latest(key)
        if point is not None:
            latest.append(
                SeriesLatest(name=key.name, labels=dict(key.labels), ts=point.ts, value=point.value)
            )
    parts = session.exec(
        select(Participant)
        .where(Participant.node_name == name)
        .order_by(Participant.job_name, Participant.role, Participant.rank)  # type: ignore[arg-type]
    ).all()
    base = _node_public(node, store, now)
    return NodeDetail(
        **base.model_dump(),
        fingerprint=node.fingerprint,
        latest=latest,
        participants=[_participant_public(p, now) for p in parts],
    )


def _job_public(job: Job, parts: list[Participant]) -> JobPublic:
    return JobPublic(
        name=job.name,
        created_at=job.created_at,
        last_seen_at=job.last_seen_at,
        participants=len(parts),
        phases=dict(Counter(p.phase for p in parts)),
    )


def list_jobs(session: Session) -> list[JobPublic]:
    jobs = session.exec(select(Job).order_by(Job.name)).all()
    parts: dict[str, list[Participant]] = {}
    for p in session.exec(select(Participant)).all():
        parts.setdefault(p.job_name, []).append(p)
    return [_job_public(j, parts.get(j.name, [])) for j in jobs]


def job_detail(session: Session, *, name: str, now: float | None = None) -> JobDetail:
    now = time.time() if now is None else now
    job = session.exec(select(Job).where(Job.name == name)).first()
    if job is None:
        raise NotFound(f"no job named {name!r}")
    parts = list(
        session.exec(
            select(Participant)
            .where(Participant.job_name == name)
            .order_by(Participant.role, Participant.rank)  # type: ignore[arg-type]
        ).all()
    )
    return JobDetail(
        **_job_public(job, parts).model_dump(),
        participant_list=[_participant_public(p, now) for p in parts],
    )


def query_series(
    store: SeriesStore,
    *,
    node: str | None,
    name: str | None,
    since: float | None,
    now: float | None = None,
    limit: int = 200,
) -> tuple[list[SeriesPoints], bool]:
    """Points of the series matching ``node``/``name`` at or after ``since`` (default: 5 min ago).

    Returns (series, truncated). ``since`` may be negative: seconds before ``now``.
    """
    if node is None and name is None:
        raise InvalidInput("give at least one of node= and name=")
    now = time.time() if now is None else now
    if since is None:
        since = now - 300
    elif since < 0:
        since = now + since
    keys = sorted(store.keys(node=node, name=name), key=lambda k: (k.node, k.name, k.labels))
    truncated = len(keys) > limit
    out = [
        SeriesPoints(
            node=k.node,
            name=k.name,
            labels=dict(k.labels),
            points=[(p.ts, p.value) for p in store.since(k, since)],
        )
        for k in keys[:limit]
    ]
    return out, truncated


def user_public(user: User) -> UserPublic:
    # Every field has the row's name: pydantic copies them (and refuses a row without an id).
    return UserPublic.model_validate(user, from_attributes=True)


def token_public(token: ApiToken) -> TokenPublic:
    assert token.id is not None
    return TokenPublic(
        id=token.id,
        kind=str(token.kind),
        prefix=token.prefix,
        node=token.node_name,
        user_id=token.user_id,
        description=token.description,
        created_at=token.created_at,
        revoked_at=token.revoked_at,
        jobs=token.job_patterns,
    )


def audit_public(event: AuditEvent) -> AuditEventPublic:
    return AuditEventPublic.model_validate(event, from_attributes=True)


def list_audit(session: Session, *, limit: int = 100) -> list[AuditEventPublic]:
    rows = session.exec(
        select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)  # type: ignore[union-attr]
    ).all()
    return [audit_public(e) for e in rows]


def node_count(session: Session) -> int:
    """How many nodes are registered (the Overview picks its layout by it)."""
    return int(session.exec(select(func.count()).select_from(Node)).one())


def job_names(session: Session) -> list[str]:
    return list(session.exec(select(Job.name).order_by(Job.name)).all())


def job_node_names(session: Session, job: str) -> set[str]:
    """The nodes a job has participants on (empty for a job nobody knows)."""
    rows = session.exec(select(Participant.node_name).where(Participant.job_name == job)).all()
    return {node for node in rows if node}
