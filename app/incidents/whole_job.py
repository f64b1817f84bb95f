"""One whole-job action per job in flight, whichever incident planned it.

A fault that takes a job down as a whole shows up as several incidents: a dead Ray driver loses
the trainer and the rollout, two ``heartbeat_lost``; each escalates to ``restart_job``. Planned
twice, the approver is asked twice, and approving the second resubmission stops the job the
first has just brought back. So a plan's whole-job actions (``WHOLE_JOB_ACTIONS``) that another
open incident of the same job has in flight — waiting for approval, pending, dispatched or
running — are not written again; the timeline names the action that covers them. The incident
stays open and resolves when its signal clears (the covering action brought the job back); if
the covering action fails or is refused, the incident's next escalation or retry plans again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session, col, select

from app.incidents.timeline import add_event
from app.models.action import ActionStatus, RecoveryAction
from app.models.incident import Incident, IncidentEventType, IncidentStatus
from app.policy.plans import WHOLE_JOB_ACTIONS, PlannedAction

IN_FLIGHT = (
    ActionStatus.pending_approval.value,
    ActionStatus.pending.value,
    ActionStatus.dispatched.value,
    ActionStatus.running.value,
)


def covering_action(
    session: Session, inc: Incident, action: PlannedAction
) -> RecoveryAction | None:
    """The in-flight action of another open incident that does ``action`` to the same job."""
    if action.action not in WHOLE_JOB_ACTIONS or not action.job:
        return None
    return session.exec(
        select(RecoveryAction)
        .join(Incident, col(Incident.id) == col(RecoveryAction.incident_id))
        .where(
            RecoveryAction.job == action.job,
            RecoveryAction.action == action.action.value,
            col(RecoveryAction.status).in_(IN_FLIGHT),
            RecoveryAction.incident_id != inc.id,
            Incident.status == IncidentStatus.open.value,
        )
        .order_by(col(RecoveryAction.id))
    ).first()


def drop_covered(
    session: Session, inc: Incident, actions: Sequence[PlannedAction], now: datetime
) -> list[PlannedAction]:
    """``actions`` less the whole-job ones already in flight for their job, each dropped one
    said on the incident's timeline."""
    kept = []
    for a in actions:
        cover = covering_action(session, inc, a)
        if cover is None:
            kept.append(a)
            continue
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.ACTION_COVERED,
            at=now,
            detail={
                "action": a.action.value,
                "job": a.job,
                "covered_by_action": cover.id,
                "covered_by_incident": cover.incident_id,
                "status": cover.status,
            },
        )
    return kept
