"""Resetting a circuit breaker (``app.guardrails.breaker``): an approver's call, audited, and
said on the timeline of the incident that tripped it (who closed it, when, why).

Here rather than beside the breaker because it writes an incident's timeline: the guard-rails
are read by the incident writer (``app.incidents.persist``), so they cannot write incidents
themselves without an import cycle.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session

from app.auth.audit import record_audit
from app.core.db import begin_write
from app.core.errors import Conflict, Forbidden, NotFound
from app.guardrails.breaker import RESET_ROLE, check_scope
from app.incidents.timeline import add_event
from app.models import Role, User
from app.models._types import utcnow
from app.models.guardrails import CircuitBreaker
from app.models.incident import Incident, IncidentEventType


def reset_breaker(
    session: Session, *, scope: str, actor: str, comment: str = "", now: datetime | None = None
) -> CircuitBreaker:
    """Close an open breaker (an approver's call; audited). Automation resumes for the scope and
    counts afresh from now."""
    check_scope(scope)
    # Two approvers resetting at once: the second waits here and finds it closed (409).
    begin_write(session)
    row = session.get(CircuitBreaker, scope, with_for_update=True)
    if row is None:
        raise NotFound(f"breaker {scope!r} never tripped")
    if not row.open:
        raise Conflict(f"breaker {scope!r} is not open")
    now = now or utcnow()
    row.open, row.reset_at, row.reset_by = False, now, actor
    session.add(row)
    record_audit(
        session,
        actor=actor,
        action="breaker.reset",
        target=scope,
        detail={"reason": row.reason, "incident_id": row.incident_id, "comment": comment},
    )
    if row.incident_id is not None and session.get(Incident, row.incident_id) is not None:
        # The incident that says why it tripped also says who closed it, and when.
        add_event(
            session,
            incident_id=row.incident_id,
            type_=IncidentEventType.BREAKER_RESET,
            actor=actor,
            at=now,
            detail={"text": f"breaker {scope} reset by {actor}", "comment": comment},
        )
    session.flush()
    return row


def reset_breaker_as(
    session: Session, *, scope: str, user: User, comment: str = "", now: datetime | None = None
) -> CircuitBreaker:
    """:func:`reset_breaker` for a signed-in user: refused (nothing changed) below the
    approver role; the audit row names the user as the REST API's does."""
    if not Role(user.role).allows(RESET_ROLE):
        raise Forbidden(
            f"resetting a breaker needs the {RESET_ROLE.value} role; {user.name} is {user.role}"
        )
    return reset_breaker(session, scope=scope, actor=f"user:{user.name}", comment=comment, now=now)
