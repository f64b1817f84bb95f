"""Reading incidents back: for the REST API and the dashboard, for the policy engine after a
restart, and for the metrics export. Nothing here writes."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from app.core.errors import InvalidInput, NotFound
from app.incidents.public import (
    FaultSignalPublic,
    IncidentDetail,
    IncidentEventPublic,
    IncidentsPublic,
    action_public,
    approval_public,
    incident_public,
)
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval
from app.models.incident import FaultSignalRecord, Incident, IncidentEvent, IncidentStatus
from app.policy.engine import OpenIncident
from app.policy.signals import FaultKind, Subject, Tier

INCIDENT_STATUSES = ("open", "resolved", "all")

_LIVE_ACTION_STATUSES = (
    ActionStatus.pending_approval.value,
    ActionStatus.pending.value,
    ActionStatus.dispatched.value,
    ActionStatus.running.value,
)


def open_incidents_for_engine(session: Session) -> list[OpenIncident]:
    """Open incidents as the engine remembers them (to restore it after a restart)."""
    out = []
    for inc in session.exec(
        select(Incident).where(Incident.status == IncidentStatus.open.value)
    ).all():
        try:
            kind = FaultKind(inc.kind)
        except ValueError:
            continue
        opened = inc.opened_at.timestamp()
        out.append(
            OpenIncident(
                key=inc.key,
                kind=kind,
                subject=Subject.from_dict(inc.subject),
                tier=Tier(inc.tier),
                opened_at=opened,
                last_active=inc.updated_at.timestamp(),
                last_since=(inc.evidence or {}).get("since"),
                escalated=inc.escalated,
                recovery_failures=inc.recovery_failures,
                retried_failures=inc.recovery_failures,
            )
        )
    return out


def open_incident_failures(session: Session) -> dict[str, int]:
    rows = session.exec(
        select(Incident.key, Incident.recovery_failures).where(
            Incident.status == IncidentStatus.open.value
        )
    ).all()
    return {k: n for k, n in rows}


def open_incidents_whose_plan_succeeded(session: Session) -> set[str]:
    """Keys of open incidents whose newest plan succeeded: nothing of theirs is waiting or
    running, and their newest action that was not cancelled succeeded (a plan's actions are
    written together, and a failed one is answered by a new plan, see the engine)."""
    rows = session.exec(
        select(Incident.key, RecoveryAction.status)
        .join(RecoveryAction, col(RecoveryAction.incident_id) == col(Incident.id))
        .where(
            Incident.status == IncidentStatus.open.value,
            RecoveryAction.status != ActionStatus.cancelled.value,
        )
        .order_by(col(RecoveryAction.id))
    ).all()
    newest: dict[str, str] = {}
    live: set[str] = set()
    for key, status in rows:
        newest[key] = status
        if status in _LIVE_ACTION_STATUSES:
            live.add(key)
    return {k for k, st in newest.items() if st == ActionStatus.succeeded.value} - live


def open_incident_counts(session: Session) -> list[tuple[str, str, int]]:
    """``(kind, tier, open incidents)`` for every kind and tier with an open incident (what
    ``app.metrics.IncidentCollector`` exports; kinds and tiers are closed sets)."""
    rows = session.exec(
        select(Incident.kind, Incident.tier, func.count())
        .where(Incident.status == IncidentStatus.open.value)
        .group_by(Incident.kind, Incident.tier)
        .order_by(Incident.kind, Incident.tier)
    ).all()
    return [(kind, tier, int(n)) for kind, tier, n in rows]


def open_incident_counts_source(engine: Engine) -> Callable[[], list[tuple[str, str, int]]]:
    """What ``app.metrics.IncidentCollector`` calls (in the scrape's thread)."""

    def compute() -> list[tuple[str, str, int]]:
        with Session(engine) as session:
            return open_incident_counts(session)

    return compute


def list_incidents(
    session: Session,
    *,
    status: str = "all",
    tier: str | None = None,
    job: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> IncidentsPublic:
    if status not in INCIDENT_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(INCIDENT_STATUSES)}, got {status!r}")
    if tier is not None and tier not in {t.value for t in Tier}:
        raise InvalidInput(f"tier must be light, medium or heavy, got {tier!r}")
    if not 1 <= limit <= 1000 or offset < 0:
        raise InvalidInput(
            f"limit must be 1..1000 and offset >= 0, got limit={limit} offset={offset}"
        )
    q = select(Incident)
    cq = select(func.count()).select_from(Incident)
    for cond in (
        Incident.status == status if status != "all" else None,
        Incident.tier == tier if tier else None,
        Incident.job == job if job else None,
    ):
        if cond is not None:
            q, cq = q.where(cond), cq.where(cond)
    rows = session.exec(q.order_by(col(Incident.id).desc()).offset(offset).limit(limit)).all()
    return IncidentsPublic(
        incidents=[incident_public(r) for r in rows], count=session.exec(cq).one()
    )


def incident_detail(session: Session, *, incident_id: int) -> IncidentDetail:
    inc = session.get(Incident, incident_id)
    if inc is None:
        raise NotFound(f"no incident with id {incident_id}")
    signals = session.exec(
        select(FaultSignalRecord)
        .where(FaultSignalRecord.incident_id == incident_id)
        .order_by(col(FaultSignalRecord.id))
    ).all()
    actions = session.exec(
        select(RecoveryAction)
        .where(RecoveryAction.incident_id == incident_id)
        .order_by(col(RecoveryAction.id))
    ).all()
    approvals = session.exec(
        select(Approval).where(Approval.incident_id == incident_id).order_by(col(Approval.id))
    ).all()
    # The timeline is read last: a worker records an action's status and its timeline entry in
    # one commit, so any status seen above has its entry below, even though these reads are
    # separate statements (READ COMMITTED) and a commit may land between them.
    events = session.exec(
        select(IncidentEvent)
        .where(IncidentEvent.incident_id == incident_id)
        .order_by(col(IncidentEvent.id))
    ).all()
    base = incident_public(inc).model_dump()
    return IncidentDetail(
        **base,
        evidence=inc.evidence,
        timeline=[
            IncidentEventPublic(at=e.at, type=e.type, actor=e.actor, detail=e.detail)
            for e in events
        ],
        signals=[
            FaultSignalPublic(
                at=s.at,
                kind=s.kind,
                tier=s.tier,
                subject=s.subject,
                evidence=s.evidence,
                since=s.since,
            )
            for s in signals
        ],
        actions=[action_public(a) for a in actions],
        approvals=[
            approval_public(a, [x for x in actions if x.approval_id == a.id]) for a in approvals
        ],
    )
