"""How long resolved incidents are kept: the scheduler's retention job (every 6 h)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.models.incident import Incident, IncidentStatus


def delete_resolved_before(engine: Engine, cutoff: datetime) -> int:
    """Delete every incident resolved before ``cutoff`` (the database's cascades delete its
    timeline, actions and approvals); how many."""
    with Session(engine) as session:
        old = session.exec(
            select(Incident).where(
                Incident.status == IncidentStatus.resolved.value,
                col(Incident.resolved_at) < cutoff,
            )
        ).all()
        for inc in old:
            session.delete(inc)
        session.commit()
    return len(old)
