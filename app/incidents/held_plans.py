"""When a hold on an open incident's plan ends: a silence that stops actions expires, or a
maintenance window of its node or job closes.

Holding a plan is the incident writer's verdict when it plans (``actions_held`` on the
timeline, which keeps the plan it held). Once nothing holds it any more and the incident is
still open, the plan is planned (``actions_released``), through the guard-rails like any plan,
unless something planned since (an escalation, a retry) has replaced it. Without this an
incident held at its opening would keep its plan unrun for as long as it stays open.

The scheduler calls :func:`release_ended_holds` every few seconds on the lease holder; the
incidents it looks at are the open ones whose plan was ever held, a handful on a bad day.
(Muted *alerts* need no such job: the alert path asks again at every flush.)
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.incidents.persist import PersistResult, PlanContext, next_plan_stage, plan_incident
from app.incidents.timeline import add_event
from app.models.incident import Incident, IncidentEvent, IncidentEventType, IncidentStatus
from app.policy.plans import PlannedAction
from app.policy.policy_file import Policy
from app.silences.muting import action_hold

# Entries after which a held plan is no longer the incident's plan.
_REPLANNED = frozenset(
    {
        IncidentEventType.ACTION_PLANNED,
        IncidentEventType.ESCALATED,
        IncidentEventType.RECOVERY_RETRY,
        IncidentEventType.ACTIONS_RELEASED,
    }
)
_LOOKED_AT = _REPLANNED | {IncidentEventType.ACTIONS_HELD}


def release_ended_holds(
    session: Session, *, policy: Policy, dry_run: bool, now: datetime
) -> PersistResult:
    """Plan what a hold that has ended held back; the caller commits, then dispatches
    ``new_actions``."""
    out = PersistResult()
    ctx = PlanContext(policy=policy, dry_run=dry_run)
    for inc, held, replanned_at in _held(session):
        if (held.id or 0) <= replanned_at or action_hold(session, inc, now) is not None:
            continue
        plan = [PlannedAction.from_dict(a) for a in (held.detail or {}).get("plan") or []]
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTIONS_RELEASED,
            at=now,
            detail={
                "text": "the hold has ended and the incident is still open: its plan is planned now",
                "actions": [a.action.value for a in plan],
            },
        )
        plan_incident(session, inc, plan, ctx, now, out, stage=next_plan_stage(session, inc))
    return out


def _held(session: Session) -> list[tuple[Incident, IncidentEvent, int]]:
    """Open incidents whose plan was ever held: the newest hold, and the id of the newest
    entry that replanned them."""
    ever = (
        select(IncidentEvent.incident_id)
        .join(Incident, col(Incident.id) == col(IncidentEvent.incident_id))
        .where(
            Incident.status == IncidentStatus.open.value,
            IncidentEvent.type == IncidentEventType.ACTIONS_HELD.value,
        )
        .distinct()
    )
    incidents = session.exec(
        select(Incident).where(col(Incident.id).in_(ever)).order_by(col(Incident.id))
    ).all()
    out = []
    for inc in incidents:
        events = session.exec(
            select(IncidentEvent)
            .where(
                IncidentEvent.incident_id == inc.id,
                col(IncidentEvent.type).in_([t.value for t in _LOOKED_AT]),
            )
            .order_by(col(IncidentEvent.id))
        ).all()
        held = [e for e in events if e.type == IncidentEventType.ACTIONS_HELD.value][-1]
        replanned = [e.id or 0 for e in events if e.type != IncidentEventType.ACTIONS_HELD.value]
        out.append((inc, held, max(replanned, default=0)))
    return out
