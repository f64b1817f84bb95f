"""Incidents: persist the policy engine's decisions, and read incidents back for the API.

``persist_decisions`` writes, in the caller's transaction, everything one tick decided: the
incident rows, their timeline, the signal that caused each decision, the recovery actions (the
outbox) and, for heavy plans, the approval they wait for. Actions are handed to Celery only
after that transaction commits (``app.services.outbox``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from app.alerts.service import on_incident_event
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import FaultSignalRecord, Incident, IncidentEvent, IncidentStatus
from app.models.incident_public import (
    ActionPublic,
    ApprovalPublic,
    FaultSignalPublic,
    IncidentDetail,
    IncidentEventPublic,
    IncidentPublic,
    IncidentsPublic,
)
from app.policy.engine import DecisionType, IncidentDecision, OpenIncident
from app.policy.plans import PlannedAction
from app.policy.policy_file import Policy
from app.policy.signals import FaultKind, Subject, Tier
from app.services.errors import InvalidInput, NotFound

log = logging.getLogger("rlguard.incidents")


@dataclass(slots=True)
class PersistResult:
    opened: list[int] = field(default_factory=list)
    resolved_keys: list[str] = field(default_factory=list)
    new_actions: list[int] = field(default_factory=list)
    approvals: list[int] = field(default_factory=list)


def add_event(
    session: Session,
    *,
    incident_id: int | None,
    type_: str,
    actor: str = "system",
    detail: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> None:
    # Callers pass ``incident.id`` of a row SQLModel types as ``int | None``; it is set once
    # the incident was flushed, which every caller has done.
    if incident_id is None:
        raise ValueError(f"{type_!r} event for an incident that was never flushed (no id)")
    row = IncidentEvent(
        incident_id=incident_id, type=type_, actor=actor, detail=detail or {}, at=at or utcnow()
    )
    session.add(row)
    # Alerts (Slack/WeCom/webhook) hang off the timeline: one call site for every entry.
    on_incident_event(session, row)


def _open_incident(session: Session, key: str) -> Incident | None:
    return session.exec(select(Incident).where(Incident.open_key == key)).first()


def persist_decisions(
    session: Session,
    *,
    decisions: Sequence[IncidentDecision],
    policy: Policy,
    now: datetime | None = None,
) -> PersistResult:
    """Write one tick's decisions; the caller commits (and then dispatches ``new_actions``)."""
    now = now or utcnow()
    out = PersistResult()
    for d in decisions:
        if d.type is DecisionType.OPEN:
            _persist_open(session, d, policy, now, out)
        elif d.type is DecisionType.UPDATE:
            inc = _open_incident(session, d.key)
            if inc is not None and d.signal is not None:
                inc.evidence, inc.updated_at = d.signal.to_dict(), now
                _record_signal(session, inc, d, now)
                add_event(
                    session,
                    incident_id=inc.id,
                    type_="updated",
                    at=now,
                    detail={"detail": d.signal.evidence.detail},
                )
        elif d.type is DecisionType.ESCALATE:
            inc = _open_incident(session, d.key)
            if inc is None:
                continue
            if d.recovery_did_not_hold:
                _count_recovery_that_did_not_hold(session, inc, d, now)
            previous = inc.tier
            inc.tier, inc.escalated, inc.reasons, inc.updated_at = (
                d.tier.value,
                True,
                list(d.reasons),
                now,
            )
            add_event(
                session,
                incident_id=inc.id,
                type_="escalated",
                at=now,
                detail={"from": previous, "to": d.tier.value, "reasons": list(d.reasons)},
            )
            if d.signal is not None and not d.recovery_did_not_hold:
                _record_signal(session, inc, d, now)
            _cancel_unstarted(session, inc, now, why="superseded by the escalation plan")
            _plan(session, inc, d.actions, policy, now, out, stage=_next_plan_stage(session, inc))
        elif d.type is DecisionType.RETRY:
            inc = _open_incident(session, d.key)
            if inc is None:
                continue
            if d.recovery_did_not_hold:
                _count_recovery_that_did_not_hold(session, inc, d, now)
            inc.updated_at = now
            add_event(
                session,
                incident_id=inc.id,
                type_="recovery_retry",
                at=now,
                detail={"reasons": list(d.reasons), "failures": inc.recovery_failures},
            )
            _cancel_unstarted(session, inc, now, why="replaced by the retried plan")
            _plan(session, inc, d.actions, policy, now, out, stage=_next_plan_stage(session, inc))
        elif d.type is DecisionType.RESOLVE:
            inc = _open_incident(session, d.key)
            if inc is None:
                continue
            resolve_incident(
                session, incident=inc, now=now, why="signal quiet for the quiet period"
            )
            out.resolved_keys.append(d.key)
    return out


def _persist_open(
    session: Session, d: IncidentDecision, policy: Policy, now: datetime, out: PersistResult
) -> None:
    existing = _open_incident(session, d.key)
    if existing is not None:
        # The engine restarted without knowing it: treat as an update, never a duplicate.
        return
    sig = d.signal
    inc = Incident(
        key=d.key,
        open_key=d.key,
        kind=d.kind.value,
        tier=d.tier.value,
        subject=d.subject.to_dict(),
        job=d.subject.job,
        node=d.subject.node,
        summary=(sig.evidence.detail if sig else "")[:500],
        evidence=sig.to_dict() if sig else {},
        reasons=list(d.reasons),
        escalated=bool(d.reasons),
        opened_at=now,
        updated_at=now,
        detection_delay_seconds=d.detection_delay,
    )
    try:
        with session.begin_nested():
            session.add(inc)
            session.flush()
    except IntegrityError:
        log.warning("incident %s already open (concurrent writer)", d.key)
        return
    assert inc.id is not None
    out.opened.append(inc.id)
    add_event(
        session,
        incident_id=inc.id,
        type_="opened",
        at=now,
        detail={
            "tier": d.tier.value,
            "reasons": list(d.reasons),
            "detection_delay_seconds": d.detection_delay,
        },
    )
    _record_signal(session, inc, d, now)
    _plan(session, inc, d.actions, policy, now, out, stage=0)


def _count_recovery_that_did_not_hold(
    session: Session, inc: Incident, d: IncidentDecision, now: datetime
) -> None:
    """The fault came back after its plan succeeded: one more failed local recovery, with the
    occurrence that showed it (the engine restored after a restart reads ``since`` from the
    evidence, and must not count this occurrence twice)."""
    inc.recovery_failures += 1
    if d.signal is not None:
        inc.evidence = d.signal.to_dict()
        _record_signal(session, inc, d, now)
    add_event(
        session,
        incident_id=inc.id,
        type_="recovery_did_not_hold",
        at=now,
        detail={
            "detail": d.signal.evidence.detail if d.signal is not None else "",
            "failures": inc.recovery_failures,
        },
    )


def _record_signal(session: Session, inc: Incident, d: IncidentDecision, now: datetime) -> None:
    sig = d.signal
    if sig is None:
        return
    session.add(
        FaultSignalRecord(
            incident_id=inc.id,  # type: ignore[arg-type]
            at=now,
            kind=sig.kind.value,
            tier=d.tier.value,
            subject=sig.subject.to_dict(),
            evidence=sig.evidence.to_dict(),
            since=sig.since,
        )
    )


def _next_plan_stage(session: Session, inc: Incident) -> int:
    """Plans of one incident are numbered: the opening plan is stage 0 and each escalation or
    retry (counted from the timeline) starts the next one, so a replanned action gets an
    idempotency key distinct from the earlier plan's."""
    replans = session.exec(
        select(func.count())
        .select_from(IncidentEvent)
        .where(
            IncidentEvent.incident_id == inc.id,
            col(IncidentEvent.type).in_(["escalated", "recovery_retry"]),
        )
    ).one()
    return 1 + replans


def _plan(
    session: Session,
    inc: Incident,
    actions: Sequence[PlannedAction],
    policy: Policy,
    now: datetime,
    out: PersistResult,
    *,
    stage: int,
) -> None:
    assert inc.id is not None
    approval: Approval | None = None
    if any(a.needs_approval for a in actions):
        names = ", ".join(a.action.value for a in actions if a.needs_approval)
        approval = Approval(
            incident_id=inc.id,
            summary=f"{inc.kind} on {Subject.from_dict(inc.subject).key()}: {names}"[:500],
            requested_at=now,
            expires_at=now + timedelta(seconds=policy.approval.expire_seconds),
        )
        session.add(approval)
        session.flush()
        out.approvals.append(approval.id)  # type: ignore[arg-type]
        add_event(
            session,
            incident_id=inc.id,
            type_="approval_requested",
            at=now,
            detail={
                "approval_id": approval.id,
                "actions": names,
                "expires_at": approval.expires_at.isoformat(),
            },
        )
    for a in actions:
        row = RecoveryAction(
            incident_id=inc.id,
            approval_id=approval.id if (a.needs_approval and approval) else None,
            idempotency_key=f"inc{inc.id}/s{stage}/{a.identity()}",
            action=a.action.value,
            job=a.job,
            node=a.node,
            queue=a.queue,
            params=dict(a.params),
            status=(
                ActionStatus.pending_approval if a.needs_approval else ActionStatus.pending
            ).value,
            created_at=now,
        )
        session.add(row)
        session.flush()
        add_event(
            session,
            incident_id=inc.id,
            type_="action_planned",
            at=now,
            detail={
                "action_id": row.id,
                "action": row.action,
                "node": row.node,
                "status": row.status,
            },
        )
        if row.status == ActionStatus.pending.value:
            out.new_actions.append(row.id)  # type: ignore[arg-type]


def _cancel_unstarted(session: Session, inc: Incident, now: datetime, *, why: str) -> None:
    rows = session.exec(
        select(RecoveryAction).where(
            RecoveryAction.incident_id == inc.id,
            col(RecoveryAction.status).in_(
                [ActionStatus.pending.value, ActionStatus.pending_approval.value]
            ),
        )
    ).all()
    for row in rows:
        row.status, row.finished_at, row.error = ActionStatus.cancelled.value, now, why
    for appr in session.exec(
        select(Approval).where(
            Approval.incident_id == inc.id, Approval.status == ApprovalStatus.pending.value
        )
    ).all():
        appr.status, appr.decided_at, appr.comment = ApprovalStatus.expired.value, now, why


def resolve_incident(
    session: Session, *, incident: Incident, now: datetime, why: str, actor: str = "system"
) -> None:
    incident.status, incident.open_key = IncidentStatus.resolved.value, None
    incident.resolved_at = incident.updated_at = now
    add_event(
        session,
        incident_id=incident.id,
        type_="resolved",
        actor=actor,
        at=now,
        detail={"why": why},
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


_LIVE_ACTION_STATUSES = (
    ActionStatus.pending_approval.value,
    ActionStatus.pending.value,
    ActionStatus.dispatched.value,
    ActionStatus.running.value,
)


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


# -- read side --------------------------------------------------------------------------------


def _public(inc: Incident) -> IncidentPublic:
    return IncidentPublic(
        id=inc.id,  # type: ignore[arg-type]
        key=inc.key,
        kind=inc.kind,
        tier=inc.tier,
        status=inc.status,
        subject=inc.subject,
        job=inc.job,
        node=inc.node,
        summary=inc.summary,
        escalated=inc.escalated,
        safe_mode=inc.safe_mode,
        reasons=inc.reasons,
        opened_at=inc.opened_at,
        updated_at=inc.updated_at,
        resolved_at=inc.resolved_at,
        detection_delay_seconds=inc.detection_delay_seconds,
    )


def action_public(row: RecoveryAction) -> ActionPublic:
    return ActionPublic(
        id=row.id,  # type: ignore[arg-type]
        action=row.action,
        status=row.status,
        job=row.job,
        node=row.node,
        queue=row.queue,
        params=row.params,
        idempotency_key=row.idempotency_key,
        attempts=row.attempts,
        approval_id=row.approval_id,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker=row.worker,
        result=row.result,
        error=row.error,
    )


def approval_public(row: Approval, actions: list[RecoveryAction] | None = None) -> ApprovalPublic:
    return ApprovalPublic(
        id=row.id,  # type: ignore[arg-type]
        incident_id=row.incident_id,
        status=row.status,
        summary=row.summary,
        requested_at=row.requested_at,
        expires_at=row.expires_at,
        decided_at=row.decided_at,
        decided_by=row.decided_by,
        comment=row.comment,
        actions=[action_public(a) for a in actions or []],
    )


INCIDENT_STATUSES = ("open", "resolved", "all")


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
    return IncidentsPublic(incidents=[_public(r) for r in rows], count=session.exec(cq).one())


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
    base = _public(inc).model_dump()
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
