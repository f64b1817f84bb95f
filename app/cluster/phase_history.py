"""Reading the phase history of a job's participants (REST API and Job page alike)."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, col, select

from app.cluster.public import PhaseHistoryPublic, PhaseTransitionPublic
from app.core.errors import InvalidInput, NotFound
from app.models import Job
from app.models.phase import PhaseTransition

DEFAULT_WINDOW = timedelta(hours=1)
MAX_TRANSITIONS = 10_000


def _public(row: PhaseTransition) -> PhaseTransitionPublic:
    return PhaseTransitionPublic(
        role=row.role,
        rank=row.rank,
        node=row.node_name,
        phase=row.phase,
        previous_phase=row.previous_phase,
        step=row.step,
        at=row.at,
    )


def phase_history(
    session: Session,
    *,
    job: str,
    now: datetime,
    since: datetime | None = None,
    limit: int = MAX_TRANSITIONS,
) -> PhaseHistoryPublic:
    """Transitions of ``job`` at or after ``since`` (default: the last hour), oldest first.

    Each participant's latest transition before ``since`` comes first, so the phase it was in at
    ``since`` is known. Raises ``NotFound`` for an unknown job and ``InvalidInput`` for a naive
    or future ``since`` or a ``limit`` outside 1..10000.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_TRANSITIONS:
        raise InvalidInput(f"limit must be an integer in 1..{MAX_TRANSITIONS}, got {limit!r}")
    if since is None:
        since = now - DEFAULT_WINDOW
    elif since.tzinfo is None:
        raise InvalidInput(f"since must carry a time zone (e.g. ...Z), got {since.isoformat()!r}")
    elif since > now:
        raise InvalidInput(f"since {since.isoformat()!r} is in the future")
    if session.exec(select(Job.id).where(Job.name == job)).first() is None:
        raise NotFound(f"no job named {job!r}")
    t = PhaseTransition
    # Per participant, the newest transition before the window: the phase it starts in.
    before = (
        select(t.role, t.rank, sa.func.max(t.at).label("at"))
        .where(t.job_name == job, t.at < since)
        .group_by(col(t.role), col(t.rank))
        .subquery()
    )
    opening = session.exec(
        select(t)
        .join(
            before,
            sa.and_(
                col(t.role) == before.c.role,
                col(t.rank) == before.c.rank,
                col(t.at) == before.c.at,
            ),
        )
        .where(t.job_name == job)
    ).all()
    rows = session.exec(
        select(t)
        .where(t.job_name == job, t.at >= since)
        .order_by(t.at, t.role, t.rank)  # type: ignore[arg-type]
        .limit(limit + 1)
    ).all()
    truncated = len(rows) > limit
    data = [_public(r) for r in sorted(opening, key=lambda r: (r.at, r.role, r.rank))]
    data.extend(_public(r) for r in rows[:limit])
    return PhaseHistoryPublic(job=job, since=since, data=data, count=len(data), truncated=truncated)
