"""Releasing a job from SAFE_MODE after its heavy incident's recovery was rejected or expired.

A heavy incident puts the job in SAFE_MODE (its control file on each of its nodes) while the
recovery waits for an approver; a rejection or no decision leaves it there. An approver (or
admin) releases it here: one ``release_safe_mode`` action per node that was put in SAFE_MODE
goes to the outbox, and the incident closes, naming who released it, once all of them succeeded
(``app.actions.machine.finish_action``).

A job held with no incident (an operator wrote the control file, or an earlier run left it) is
known from the participants' phase in the ``participant`` table. Its release opens a
``safe_mode_hold`` incident with the nodes whose participants report SAFE_MODE as evidence and
plans the same action on each; it closes like any other, and a failed release can be retried
through the same endpoint. Only a job no open incident holds and none of whose participants
reports SAFE_MODE is "not held".
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session, col, func, select

from app.auth.audit import record_audit
from app.core.db import begin_write
from app.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from app.incidents.persist import insert_open_incident, resolve_incident
from app.incidents.planning import batch_of, write_plan
from app.incidents.public import JobReleasePublic, action_public
from app.incidents.timeline import add_event
from app.models import Role, User
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.models.approval import Approval, ApprovalStatus
from app.models.cluster import Job, Participant
from app.models.incident import Incident, IncidentEventType, IncidentStatus
from app.policy.plans import ActionName, PlannedAction
from app.policy.signals import Tier

log = logging.getLogger("rlguard.jobs")

MAX_COMMENT = 2000
#: The incident a release opens for a job held in SAFE_MODE by its control file alone.
HOLD_KIND = "safe_mode_hold"
SAFE_MODE_PHASE = "SAFE_MODE"
_LIVE = (
    ActionStatus.pending.value,
    ActionStatus.dispatched.value,
    ActionStatus.running.value,
)


def safe_mode_incidents(session: Session, *, job: str) -> list[Incident]:
    """Open incidents that hold ``job`` in SAFE_MODE (oldest first)."""
    return list(
        session.exec(
            select(Incident)
            .where(
                Incident.job == job,
                Incident.status == IncidentStatus.open.value,
                Incident.safe_mode == True,  # noqa: E712 - a SQL comparison
            )
            .order_by(col(Incident.id))
        ).all()
    )


def release_job(
    session: Session,
    *,
    job: str,
    user: User,
    comment: str,
    now: datetime | None = None,
) -> JobReleasePublic:
    """Plan the release of ``job`` from SAFE_MODE; the caller commits.

    Raises Forbidden (not approver/admin), InvalidInput (no comment, or too long), NotFound
    (unknown job) and Conflict (not held: no open incident holds it and no participant reports
    SAFE_MODE; an approval still pending; an incident still entering SAFE_MODE; a release
    already on its way). Nothing is written when it raises.
    """
    now = now or utcnow()
    _check_request(user, comment)
    comment = comment.strip()
    # Two releases of one job at once: the second waits for the first (the job's row locked on
    # PostgreSQL, SQLite's write lock) and then finds its release on its way (409).
    begin_write(session)
    if session.exec(select(Job).where(Job.name == job).with_for_update()).first() is None:
        raise NotFound(f"no job named {job!r}")
    incidents = safe_mode_incidents(session, job=job)
    if not incidents:
        # Held by its control file alone (or not held at all: Conflict, nothing written).
        incidents = [_open_hold_incident(session, job=job, now=now)]
    ids = [inc.id for inc in incidents]
    rows = _refuse_if_busy(session, job=job, incident_ids=ids)
    planned: list[RecoveryAction] = []
    for inc in incidents:
        planned += _plan_release(session, inc, rows, user=user, comment=comment, now=now)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="job.release",
        target=f"job:{job}",
        detail={
            "incidents": ids,
            "comment": comment,
            "actions": [r.id for r in planned],
            # held by its control file alone: the incident was opened by this release
            "control_file_hold": any(inc.kind == HOLD_KIND for inc in incidents),
        },
    )
    log.info("job %s: release from SAFE_MODE requested by %s", job, user.name)
    return JobReleasePublic(
        job=job,
        released_by=user.name,
        comment=comment,
        incidents=ids,  # type: ignore[arg-type]
        actions=[action_public(r) for r in planned],
    )


def _check_request(user: User, comment: str) -> None:
    if not Role(user.role).allows(Role.approver):
        raise Forbidden(f"releasing a job needs the approver role; {user.name} is {user.role}")
    if not isinstance(comment, str) or not comment.strip():
        raise InvalidInput("comment must say why the job is released (got an empty comment)")
    if len(comment) > MAX_COMMENT:
        raise InvalidInput(f"comment is {len(comment)} characters; at most {MAX_COMMENT}")


def _refuse_if_busy(
    session: Session, *, job: str, incident_ids: Sequence[int | None]
) -> Sequence[RecoveryAction]:
    """The actions of the incidents to release; Conflict while one of them waits for an
    approver or a release of theirs is still on its way."""
    pending = session.exec(
        select(Approval).where(
            col(Approval.incident_id).in_(incident_ids),
            Approval.status == ApprovalStatus.pending.value,
        )
    ).first()
    if pending is not None:
        raise Conflict(
            f"approval {pending.id} of incident {pending.incident_id} is still pending: "
            "approve or reject it before releasing the job"
        )
    rows = session.exec(
        select(RecoveryAction).where(col(RecoveryAction.incident_id).in_(incident_ids))
    ).all()
    running = [r for r in rows if r.action == ActionName.RELEASE_SAFE_MODE and r.status in _LIVE]
    if running:
        raise Conflict(
            f"a release of job {job!r} is already on its way (action {running[0].id}, "
            f"{running[0].status})"
        )
    return rows


def _plan_release(
    session: Session,
    inc: Incident,
    rows: Sequence[RecoveryAction],
    *,
    user: User,
    comment: str,
    now: datetime,
) -> list[RecoveryAction]:
    """One ``release_safe_mode`` action per node ``inc`` holds, as the incident's next release
    attempt, and the timeline entry that asks for it."""
    nodes = _held_nodes(inc, rows)
    # One attempt is one batch ("inc<id>/release<n>/<node>" per node), not one row.
    attempt = 1 + len(
        {
            batch_of(r.idempotency_key)
            for r in rows
            if r.incident_id == inc.id and r.action == ActionName.RELEASE_SAFE_MODE
        }
    )
    params = {
        "reason": f"released from SAFE_MODE by {user.name}: {comment}",
        "released_by": user.name,
        "comment": comment,
    }
    planned = write_plan(
        session,
        incident=inc,
        actions=[
            PlannedAction(
                action=ActionName.RELEASE_SAFE_MODE,
                job=inc.job,
                node=node,
                needs_approval=False,
                params=params,
            )
            for node in nodes
        ],
        batch=f"release{attempt}",
        now=now,
        name_of=_node_of,
    )
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.RELEASE_REQUESTED,
        actor=f"user:{user.name}",
        at=now,
        detail={"comment": comment, "nodes": nodes, "action_ids": [r.id for r in planned]},
    )
    inc.updated_at = now
    if not nodes:
        # SAFE_MODE was recorded without a node (an older incident): nothing to clear.
        _close_released(session, inc, user_name=user.name, comment=comment, now=now)
    return planned


def _node_of(action: PlannedAction) -> str:
    """A release action is named by its node inside its attempt (one per node)."""
    return str(action.node)


def _held_nodes(inc: Incident, rows: Sequence[RecoveryAction]) -> list[str]:
    """The nodes whose control file ``inc`` put (or found) in SAFE_MODE."""
    nodes = {
        r.node
        for r in rows
        if r.incident_id == inc.id
        and r.action == ActionName.ENTER_SAFE_MODE.value
        and r.status == ActionStatus.succeeded.value
        and r.node
    }
    if inc.kind == HOLD_KIND:
        nodes.update(str(n) for n in (inc.evidence or {}).get("nodes", []) if n)
    return sorted(nodes)


def _open_hold_incident(session: Session, *, job: str, now: datetime) -> Incident:
    """An incident for a job held in SAFE_MODE by its control file, with no incident holding it.

    Raises Conflict when the job is not held (no participant reports SAFE_MODE), when no
    held participant names its node, or when an open incident is still putting the job in
    SAFE_MODE (its approver decides first). Nothing is written when it raises.
    """
    held = _participants_in_safe_mode(session, job=job)
    _refuse_if_entering_safe_mode(session, job=job)
    nodes = sorted({p.node_name for p in held if p.node_name})
    if not nodes:
        raise Conflict(
            f"job {job!r} reports SAFE_MODE but none of those participants names its node, so "
            "no node worker can clear its control file"
        )
    inc = _hold_incident(job=job, held=held, nodes=nodes, now=now)
    if not insert_open_incident(session, inc):
        # Another release of the same job opened it a moment ago.
        raise Conflict(f"a release of job {job!r} is already on its way")
    return inc


def _participants_in_safe_mode(session: Session, *, job: str) -> list[Participant]:
    """The job's participants that report SAFE_MODE since its last completed release;
    Conflict (saying what they report instead) when there is none."""
    participants = session.exec(
        select(Participant)
        .where(Participant.job_name == job)
        .order_by(col(Participant.role), col(Participant.rank))
    ).all()
    # A phase reported before the job's last completed release is what that release cleared
    # (a job that stopped heartbeating keeps its last phase in the table).
    released_at = session.exec(
        select(func.max(RecoveryAction.finished_at)).where(
            RecoveryAction.job == job,
            RecoveryAction.action == ActionName.RELEASE_SAFE_MODE,
            RecoveryAction.status == ActionStatus.succeeded.value,
        )
    ).one()
    held = [
        p
        for p in participants
        if p.phase == SAFE_MODE_PHASE and (released_at is None or p.updated_at > released_at)
    ]
    if held:
        return held
    phases = Counter(p.phase for p in participants)
    seen = (
        "its participants report " + ", ".join(f"{n}× {ph}" for ph, n in sorted(phases.items()))
        if phases
        else "it has no participants"
    )
    if phases.get(SAFE_MODE_PHASE) and released_at is not None:
        seen += (
            f"; its last release finished at {released_at.isoformat()} and none has reported since"
        )
    raise Conflict(
        f"job {job!r} is not in SAFE_MODE: no open incident holds it there and none of its "
        f"participants reports phase SAFE_MODE ({seen})"
    )


def _refuse_if_entering_safe_mode(session: Session, *, job: str) -> None:
    entering = session.exec(
        select(RecoveryAction)
        .join(Incident, col(Incident.id) == col(RecoveryAction.incident_id))
        .where(
            Incident.job == job,
            Incident.status == IncidentStatus.open.value,
            RecoveryAction.action == ActionName.ENTER_SAFE_MODE.value,
            col(RecoveryAction.status).in_(_LIVE),
        )
    ).first()
    if entering is not None:
        raise Conflict(
            f"incident {entering.incident_id} is putting job {job!r} in SAFE_MODE (action "
            f"{entering.id}, {entering.status}): decide that incident before releasing the job"
        )


def _hold_incident(
    *, job: str, held: Sequence[Participant], nodes: list[str], now: datetime
) -> Incident:
    key = f"{HOLD_KIND}/job={job}"
    return Incident(
        key=key,
        open_key=key,
        kind=HOLD_KIND,
        # SAFE_MODE is the heavy tier's measure; this incident only records its release.
        tier=Tier.HEAVY.value,
        subject={"job": job},
        job=job,
        node=nodes[0] if len(nodes) == 1 else None,
        summary=(
            f"job {job} held in SAFE_MODE by its control file on {', '.join(nodes)} "
            "with no open incident"
        )[:500],
        evidence={
            "metric": "participant phase",
            "detail": "participants report phase SAFE_MODE; no open incident holds the job",
            "nodes": nodes,
            "participants": [
                {
                    "role": p.role,
                    "rank": p.rank,
                    "node": p.node_name,
                    "phase": p.phase,
                    "last_heartbeat_at": p.last_heartbeat_at.isoformat(),
                }
                for p in held
            ],
        },
        safe_mode=True,
        opened_at=now,
        updated_at=now,
    )


def on_release_succeeded(session: Session, *, action: RecoveryAction, now: datetime) -> None:
    """A node's control file says ``run`` again: close the incident once all its nodes do."""
    inc = session.get(Incident, action.incident_id)
    if inc is None or inc.status != IncidentStatus.open.value:
        return
    key = batch_of(action.idempotency_key) + "/"
    batch = [
        r
        for r in session.exec(
            select(RecoveryAction).where(
                RecoveryAction.incident_id == inc.id,
                RecoveryAction.action == ActionName.RELEASE_SAFE_MODE,
            )
        ).all()
        if r.idempotency_key.startswith(key)
    ]
    if all(r.status == ActionStatus.succeeded.value for r in batch):
        params = action.params or {}
        _close_released(
            session,
            inc,
            user_name=str(params.get("released_by", "unknown")),
            comment=str(params.get("comment", "")),
            now=now,
        )


def _close_released(
    session: Session, inc: Incident, *, user_name: str, comment: str, now: datetime
) -> None:
    inc.safe_mode = False
    add_event(
        session,
        incident_id=inc.id,
        type_=IncidentEventType.SAFE_MODE_RELEASED,
        actor=f"user:{user_name}",
        at=now,
        detail={"job": inc.job, "released_by": user_name, "comment": comment},
    )
    resolve_incident(
        session,
        incident=inc,
        now=now,
        why=f"released from SAFE_MODE by {user_name}: {comment}",
        actor=f"user:{user_name}",
    )
