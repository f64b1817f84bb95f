"""Circuit breakers per job and for the whole cluster.

A budget bounds one participant; a breaker bounds a scope: when automation acts too often, or on
too many nodes, the cause is usually larger than any one process (a bad image, a storage or
network outage) and more restarts make it worse. The breaker then stops automation for the
scope until an approver resets it. Its state is a row, so every replica and a restarted server
see the same breaker.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, col, select

from app.core.errors import InvalidInput
from app.guardrails.history import PastAction, automatic_since
from app.guardrails.window import describe_seconds, window_start
from app.models import Role
from app.models.guardrails import CircuitBreaker
from app.policy.plans import PlannedAction
from app.policy.policy_file import BreakerLimits, Guardrails

CLUSTER_SCOPE = "cluster"
_JOB_PREFIX = "job:"
# A job name as the job table holds it (up to 128 characters); no whitespace or control
# character, and no slash, which would not survive as one segment of
# /api/v1/breakers/{scope}/reset.
_JOB_NAME = re.compile(r"^[^\s/\x00-\x1f\x7f]{1,128}$")
# Resetting a breaker resumes automation that stopped itself: an approver's call.
RESET_ROLE = Role.approver


def job_scope(job: str) -> str:
    return f"{_JOB_PREFIX}{job}"


def job_of(scope: str) -> str | None:
    """The job of a ``job:<name>`` scope; None for the cluster's."""
    return scope.removeprefix(_JOB_PREFIX) if scope.startswith(_JOB_PREFIX) else None


def check_scope(scope: str) -> str:
    """``cluster`` or ``job:<name>``; anything else is refused, naming it."""
    if scope == CLUSTER_SCOPE:
        return scope
    if scope.startswith(_JOB_PREFIX) and _JOB_NAME.match(scope.removeprefix(_JOB_PREFIX)):
        return scope
    raise InvalidInput(f"invalid breaker scope {scope!r}: expected 'cluster' or 'job:<job name>'")


def scopes_of(a: PlannedAction) -> list[str]:
    """The breakers an automatic action passes: its job's (if it has one), then the cluster's."""
    return ([job_scope(a.job)] if a.job else []) + [CLUSTER_SCOPE]


def limits_for(scope: str, rails: Guardrails) -> BreakerLimits:
    return rails.cluster_breaker if scope == CLUSTER_SCOPE else rails.job_breaker


def get_breaker(session: Session, scope: str) -> CircuitBreaker | None:
    return session.get(CircuitBreaker, scope)


def open_reason(row: CircuitBreaker) -> str:
    since = row.tripped_at.isoformat(timespec="seconds") if row.tripped_at else "?"
    return f"circuit breaker {row.scope} open since {since} ({row.reason})"


@dataclass(frozen=True, slots=True)
class Trip:
    scope: str
    reason: str


def would_trip(
    session: Session,
    scope: str,
    rails: Guardrails,
    *,
    now: datetime,
    planned: Sequence[PastAction],
    candidate: PastAction,
) -> Trip | None:
    """Whether running ``candidate`` (after ``planned``, the plan's earlier automatic actions)
    takes the scope over its limits. Actions before the last reset are not counted again."""
    limits = limits_for(scope, rails)
    row = get_breaker(session, scope)
    since = window_start(
        now, limits.window_seconds, not_before=row.reset_at if row is not None else None
    )
    job = job_of(scope)
    acts = [
        *automatic_since(session, since=since, job=job),
        *(p for p in planned if job is None or p.job == job),
        candidate,
    ]
    nodes = {p.node for p in acts if p.node}
    window = describe_seconds(limits.window_seconds)
    if len(acts) > limits.max_actions:
        why = f"{len(acts)} automatic actions in {window} (limit {limits.max_actions})"
    elif len(nodes) > limits.max_nodes:
        why = f"automatic actions on {len(nodes)} nodes in {window} (limit {limits.max_nodes})"
    else:
        return None
    return Trip(scope=scope, reason=why)


def trip(session: Session, t: Trip, *, incident_id: int | None, now: datetime) -> CircuitBreaker:
    row = get_breaker(session, t.scope) or CircuitBreaker(scope=t.scope)
    row.open, row.tripped_at, row.reason, row.incident_id = True, now, t.reason[:500], incident_id
    row.trips += 1
    session.add(row)
    session.flush()
    return row


def list_breakers(session: Session) -> list[CircuitBreaker]:
    """Every breaker that ever tripped, open ones first."""
    rows = session.exec(select(CircuitBreaker).order_by(col(CircuitBreaker.scope))).all()
    return sorted(rows, key=lambda r: not r.open)
