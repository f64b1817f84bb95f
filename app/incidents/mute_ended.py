"""When what muted an open incident ends: a silence expires, a maintenance window closes, the
node incident that inhibited it resolves.

Alertmanager's rule, kept here: an alert still firing when its silence ends is sent then. An
open incident whose alert was muted (``silenced``, ``maintenance``, ``inhibited`` on its
timeline) gets an ``unmuted`` entry once nothing mutes it any more, and that entry alerts like
an opening (the message says when the incident opened). A plan held by a silence or a window
(``actions_held``, which keeps the plan it held) is planned then (``actions_released``), through
the guard-rails like any plan, unless something planned since (an escalation, a retry) has
replaced it. Without this an incident muted at its opening would stay unalerted, and its plan
unrun, for as long as it stays open.

The scheduler calls :func:`resume_unmuted` every few seconds on the lease holder; the incidents
it looks at are the open ones that were ever muted or held, a handful on a bad day.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from app.incidents.persist import PersistResult, PlanContext, next_plan_stage, plan_incident
from app.incidents.timeline import add_event
from app.models.incident import Incident, IncidentEvent, IncidentEventType, IncidentStatus
from app.policy.plans import PlannedAction
from app.policy.policy_file import Policy
from app.silences.muting import action_hold, alert_mute

_MUTED = frozenset(
    {IncidentEventType.SILENCED, IncidentEventType.MAINTENANCE, IncidentEventType.INHIBITED}
)
# Entries after which a held plan is no longer the incident's plan.
_REPLANNED = frozenset(
    {
        IncidentEventType.ACTION_PLANNED,
        IncidentEventType.ESCALATED,
        IncidentEventType.RECOVERY_RETRY,
        IncidentEventType.ACTIONS_RELEASED,
    }
)
_LOOKED_AT = _MUTED | _REPLANNED | {IncidentEventType.UNMUTED, IncidentEventType.ACTIONS_HELD}


def resume_unmuted(
    session: Session, *, policy: Policy, dry_run: bool, now: datetime
) -> PersistResult:
    """Alert and plan what a mute that has ended held back; the caller commits, then dispatches
    ``new_actions`` (and the alert deliveries queued)."""
    out = PersistResult()
    ctx = PlanContext(policy=policy, dry_run=dry_run)
    for inc, events in _muted_or_held(session):
        last: dict[IncidentEventType, IncidentEvent] = {}
        for event in events:  # oldest first: the newest of each type wins
            last[IncidentEventType(event.type)] = event
        _alert_if_unmuted(session, inc, last, now)
        _plan_if_released(session, inc, last, ctx, now, out)
    return out


def _muted_or_held(session: Session) -> list[tuple[Incident, list[IncidentEvent]]]:
    ever = (
        select(IncidentEvent.incident_id)
        .join(Incident, col(Incident.id) == col(IncidentEvent.incident_id))
        .where(
            Incident.status == IncidentStatus.open.value,
            col(IncidentEvent.type).in_(
                [t.value for t in _MUTED | {IncidentEventType.ACTIONS_HELD}]
            ),
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
        out.append((inc, list(events)))
    return out


def _newest_id(last: dict[IncidentEventType, IncidentEvent], types: frozenset[str]) -> int:
    return max((e.id or 0 for t, e in last.items() if t in types), default=0)


def _alert_if_unmuted(
    session: Session, inc: Incident, last: dict[IncidentEventType, IncidentEvent], now: datetime
) -> None:
    muted_at = _newest_id(last, _MUTED)
    if muted_at <= _newest_id(last, frozenset({IncidentEventType.UNMUTED})):
        return  # never muted, or alerted since its last mute
    if alert_mute(session, inc, now) is not None:
        return  # still muted (by that or by something else)
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.UNMUTED,
        at=now,
        detail={"text": "nothing mutes its alert any more and it is still open: alerted now"},
    )


def _plan_if_released(
    session: Session,
    inc: Incident,
    last: dict[IncidentEventType, IncidentEvent],
    ctx: PlanContext,
    now: datetime,
    out: PersistResult,
) -> None:
    held = last.get(IncidentEventType.ACTIONS_HELD)
    if held is None or (held.id or 0) <= _newest_id(last, _REPLANNED):
        return
    if action_hold(session, inc, now) is not None:
        return
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
