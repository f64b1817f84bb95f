"""Persisting the policy engine's decisions: the write side of incidents.

``persist_decisions`` writes, in the caller's transaction, everything one tick decided: the
incident rows, their timeline, the signal that caused each decision, the recovery actions (the
outbox, through ``app.incidents.planning.write_plan``) and, for heavy plans, the approval they
wait for. Actions are handed to Celery only after that transaction commits
(``app.actions.outbox``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from app.core.db import begin_savepoint
from app.guardrails.gate import GateDecision, Verdict, gate
from app.incidents.alert_inbox import flush_alerts
from app.incidents.planning import write_plan
from app.incidents.timeline import add_event
from app.incidents.whole_job import drop_covered
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.incident import (
    FaultSignalRecord,
    Incident,
    IncidentEvent,
    IncidentEventType,
    IncidentStatus,
)
from app.policy.engine import DecisionType, IncidentDecision
from app.policy.plans import PlannedAction
from app.policy.policy_file import Policy
from app.policy.signals import Subject, Tier
from app.silences.muting import action_hold

log = logging.getLogger("rlguard.incidents")


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What planning needs besides the decision: the policy (approvals, guard-rails) and the
    global dry-run setting (``Settings.automation.dry_run``)."""

    policy: Policy
    dry_run: bool = False


@dataclass(slots=True)
class PersistResult:
    opened: list[int] = field(default_factory=list)
    resolved_keys: list[str] = field(default_factory=list)
    new_actions: list[int] = field(default_factory=list)
    approvals: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Tick:
    """What every decision of one tick is written with: the same transaction, planning
    context, clock reading and result, so the handlers below take it as one argument."""

    session: Session
    ctx: PlanContext
    now: datetime
    out: PersistResult = field(default_factory=PersistResult)
    touched: set[int] = field(default_factory=set)  # incidents whose timeline this tick wrote

    def plan(self, inc: Incident, actions: Sequence[PlannedAction], *, stage: int) -> None:
        # The alert path answers for the decision before its plan is gated: the timeline
        # reads the opening (or escalation), why its alert is muted, then its plan's verdicts.
        flush_alerts(self.session, now=self.now, incident_ids=[inc.id or 0])
        plan_incident(self.session, inc, actions, self.ctx, self.now, self.out, stage=stage)


def insert_open_incident(session: Session, inc: Incident) -> bool:
    """Insert ``inc`` (open, with ``open_key`` set) and flush it; False, with nothing written,
    when an incident with the same ``open_key`` is already open (another writer was first)."""
    try:
        with begin_savepoint(session):
            session.add(inc)
            session.flush()
    except IntegrityError:
        return False
    return True


def _open_incident(session: Session, key: str) -> Incident | None:
    return session.exec(select(Incident).where(Incident.open_key == key)).first()


def persist_decisions(
    session: Session,
    *,
    decisions: Sequence[IncidentDecision],
    policy: Policy,
    now: datetime | None = None,
    dry_run: bool = False,
) -> PersistResult:
    """Write one tick's decisions; the caller commits (and then dispatches ``new_actions``).
    ``dry_run``: plan and show, run nothing (the global setting)."""
    tick = _Tick(session, PlanContext(policy=policy, dry_run=dry_run), now or utcnow())
    for d in decisions:
        if d.type is DecisionType.OPEN:
            _persist_open(tick, d)
            continue
        # A decision about an incident closed meanwhile (by a release, say) has nothing to change.
        inc = _open_incident(session, d.key)
        if inc is not None:
            tick.touched.add(inc.id or 0)
            _PERSIST_CHANGE[d.type](tick, inc, d)
    # What planning and resolving appended (an approval asked for, a resolution) is alerted in
    # this transaction too.
    flush_alerts(session, now=tick.now, incident_ids=tick.touched)
    return tick.out


def _persist_update(tick: _Tick, inc: Incident, d: IncidentDecision) -> None:
    if d.signal is None:
        return
    session, now = tick.session, tick.now
    inc.evidence, inc.updated_at = d.signal.to_dict(), now
    _record_signal(session, inc, d, now)
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.UPDATED,
        at=now,
        detail={"detail": d.signal.evidence.detail},
    )


def _persist_escalate(tick: _Tick, inc: Incident, d: IncidentDecision) -> None:
    session, now = tick.session, tick.now
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
        type_=IncidentEventType.ESCALATED,
        at=now,
        detail={"from": previous, "to": d.tier.value, "reasons": list(d.reasons)},
    )
    if d.signal is not None and not d.recovery_did_not_hold:
        _record_signal(session, inc, d, now)
    _replace_plan(tick, inc, d, why="superseded by the escalation plan")


def _persist_retry(tick: _Tick, inc: Incident, d: IncidentDecision) -> None:
    session, now = tick.session, tick.now
    if d.recovery_did_not_hold:
        _count_recovery_that_did_not_hold(session, inc, d, now)
    inc.updated_at = now
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.RECOVERY_RETRY,
        at=now,
        detail={"reasons": list(d.reasons), "failures": inc.recovery_failures},
    )
    _replace_plan(tick, inc, d, why="replaced by the retried plan")


def _persist_resolve(tick: _Tick, inc: Incident, d: IncidentDecision) -> None:
    resolve_incident(
        tick.session, incident=inc, now=tick.now, why="signal quiet for the quiet period"
    )
    tick.out.resolved_keys.append(d.key)


def _replace_plan(tick: _Tick, inc: Incident, d: IncidentDecision, *, why: str) -> None:
    """Cancel what the incident's last plan has not started and plan ``d``'s actions as its
    next stage (an escalation or a retry supersedes the plan before it)."""
    _cancel_unstarted(tick.session, inc, tick.now, why=why)
    tick.plan(inc, d.actions, stage=next_plan_stage(tick.session, inc))


_PERSIST_CHANGE: dict[DecisionType, Callable[[_Tick, Incident, IncidentDecision], None]] = {
    DecisionType.UPDATE: _persist_update,
    DecisionType.ESCALATE: _persist_escalate,
    DecisionType.RETRY: _persist_retry,
    DecisionType.RESOLVE: _persist_resolve,
}


def _persist_open(tick: _Tick, d: IncidentDecision) -> None:
    session, now = tick.session, tick.now
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
    if not insert_open_incident(session, inc):
        log.warning("incident %s already open (concurrent writer)", d.key)
        return
    assert inc.id is not None
    tick.out.opened.append(inc.id)
    tick.touched.add(inc.id)
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.OPENED,
        at=now,
        detail={
            "tier": d.tier.value,
            "reasons": list(d.reasons),
            "detection_delay_seconds": d.detection_delay,
        },
    )
    _record_signal(session, inc, d, now)
    tick.plan(inc, d.actions, stage=0)


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
        type_=IncidentEventType.RECOVERY_DID_NOT_HOLD,
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


def next_plan_stage(session: Session, inc: Incident) -> int:
    """Plans of one incident are numbered: the opening plan is stage 0 and each escalation,
    retry or release of a held plan (counted from the timeline) starts the next one, so a replanned action gets an
    idempotency key distinct from the earlier plan's."""
    replans = session.exec(
        select(func.count())
        .select_from(IncidentEvent)
        .where(
            IncidentEvent.incident_id == inc.id,
            col(IncidentEvent.type).in_(
                [
                    IncidentEventType.ESCALATED.value,
                    IncidentEventType.RECOVERY_RETRY.value,
                    IncidentEventType.ACTIONS_RELEASED.value,
                ]
            ),
        )
    ).one()
    return 1 + replans


def plan_incident(
    session: Session,
    inc: Incident,
    actions: Sequence[PlannedAction],
    ctx: PlanContext,
    now: datetime,
    out: PersistResult,
    *,
    stage: int,
) -> None:
    assert inc.id is not None
    if actions and _actions_held(session, inc, actions, now):
        return
    actions = drop_covered(session, inc, actions, now)
    # The guard-rails decide what of the plan may run (app/guardrails/gate.py); a plan with no
    # action has nothing to gate.
    verdicts = (
        gate(
            session,
            actions=actions,
            rails=ctx.policy.guardrails,
            now=now,
            incident_id=inc.id,
            dry_run=ctx.dry_run,
        )
        if actions
        else []
    )
    _record_verdicts(session, inc, verdicts, now)
    written = [v for v in verdicts if v.written]
    actions = [v.action for v in written]
    approval: Approval | None = None
    asking = [v.action for v in written if v.action.needs_approval and v.verdict != Verdict.DRY_RUN]
    if asking:
        names = ", ".join(a.action.value for a in asking)
        approval = Approval(
            incident_id=inc.id,
            summary=f"{inc.kind} on {Subject.from_dict(inc.subject).key()}: {names}"[:500],
            requested_at=now,
            expires_at=now + timedelta(seconds=ctx.policy.approval.expire_seconds),
        )
        session.add(approval)
        session.flush()
        out.approvals.append(approval.id)  # type: ignore[arg-type]
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.APPROVAL_REQUESTED,
            at=now,
            detail={
                "approval_id": approval.id,
                "actions": names,
                "expires_at": approval.expires_at.isoformat(),
            },
        )
    rows = write_plan(
        session,
        incident=inc,
        actions=actions,
        batch=f"s{stage}",
        now=now,
        approval_id=approval.id if approval is not None else None,
        dry_run=[v.verdict == Verdict.DRY_RUN for v in written],
        not_before=[v.not_before for v in written],
    )
    for row in rows:
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_PLANNED,
            at=now,
            detail={
                "action_id": row.id,
                "action": row.action,
                "node": row.node,
                "status": row.status,
            },
        )
        if row.status == ActionStatus.pending.value and row.not_before is None:
            out.new_actions.append(row.id)  # type: ignore[arg-type]


# The timeline entry of each guard-rail verdict that is not a plain "run".
_VERDICT_EVENT = {
    Verdict.DRY_RUN: IncidentEventType.ACTION_DRY_RUN,
    Verdict.DEFER: IncidentEventType.ACTION_DEFERRED,
    Verdict.BLOCKED: IncidentEventType.ACTION_NOT_RUN,
    Verdict.PAUSED: IncidentEventType.ACTION_NOT_RUN,
    Verdict.ESCALATE: IncidentEventType.GUARDRAIL_ESCALATED,
}


def _record_verdicts(
    session: Session, inc: Incident, verdicts: Sequence[GateDecision], now: datetime
) -> None:
    """Put each guard-rail decision on the timeline; a spent budget or a tripped breaker makes
    the incident heavy (its actions now wait for an approver), said once as an escalation."""
    for v in verdicts:
        if v.verdict == Verdict.RUN:
            continue
        type_ = IncidentEventType.BREAKER_TRIPPED if v.tripped else _VERDICT_EVENT[v.verdict]
        add_event(
            session,
            incident_id=inc.id,
            type_=type_,
            at=now,
            detail={
                "verdict": v.verdict.value,
                "action": v.action.action.value,
                "node": v.action.node,
                "reason": v.reason,
                "breaker": v.tripped,
            },
        )
    escalations = [v.reason for v in verdicts if v.verdict == Verdict.ESCALATE]
    if escalations and inc.tier != Tier.HEAVY.value:
        previous = inc.tier
        inc.tier, inc.escalated, inc.updated_at = Tier.HEAVY.value, True, now
        inc.reasons = [*inc.reasons, *escalations]
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ESCALATED,
            at=now,
            detail={"from": previous, "to": Tier.HEAVY.value, "reasons": escalations},
        )


def _actions_held(
    session: Session, inc: Incident, actions: Sequence[PlannedAction], now: datetime
) -> bool:
    """Guard-rail, apart from the planning itself: a silence that stops actions, or a
    maintenance window of the incident's node or job, holds the plan. Nothing is written but
    the timeline entry saying by what, which keeps the plan: it is planned when the hold ends
    (``app.incidents.held_plans``), unless an escalation or a retry has replaced it."""
    hold = action_hold(session, inc, now)
    if hold is None:
        return False
    add_event(
        session,
        incident_id=inc.id,
        type_=hold.type,
        at=now,
        detail={"text": hold.text, **hold.detail, "plan": [a.to_dict() for a in actions]},
    )
    return True


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
        type_=IncidentEventType.RESOLVED,
        actor=actor,
        at=now,
        detail={"why": why},
    )
