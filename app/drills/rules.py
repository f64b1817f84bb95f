"""What a drill must pass before anything is sent to a launcher: each refusal names the bad
value and changes nothing (no row, no request, nothing injected).

The launcher checks the rest on its node (whether it runs that process at all, and whether it
has an injection point for the fault: :mod:`recovery.supervision.drills`); its refusal comes
back through :mod:`app.drills.launcher` with its own reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlmodel import Session, col, select

from app.core.errors import Conflict, InvalidInput, NotFound
from app.drills.public import DrillCreate
from app.models import Job, Participant
from app.models.drill import Drill, DrillStatus
from app.models.incident import Incident, IncidentStatus
from recovery.report import EXITED_PHASE, FINISHED_PHASES
from recovery.supervision.drills import DRILL_FAULTS
from recovery.supervision.hook import ROLE_PATTERN
from recovery.supervision.requests import JOB_DIR_PATTERN

MAX_STEP = 2**31 - 1


@dataclass(frozen=True, slots=True)
class DrillTarget:
    """The process a drill is for, as the server knows it (its node from its agent's reports)."""

    job: str
    role: str
    rank: int
    node: str
    fault: str
    at_step: int | None


def check_values(body: DrillCreate) -> None:
    """The values alone (no database): raises InvalidInput naming the first bad one."""
    if body.fault not in DRILL_FAULTS:
        raise InvalidInput(f"fault {body.fault!r} is not one of {', '.join(DRILL_FAULTS)}")
    if not JOB_DIR_PATTERN.fullmatch(body.job):
        raise InvalidInput(f"job {body.job!r} is not a job name (letters, digits, '.', '_', '-')")
    if not ROLE_PATTERN.fullmatch(body.role):
        raise InvalidInput(f"role {body.role!r} must be 1-64 of letters, digits, '_' and '.'")
    if body.rank is not None and not 0 <= body.rank <= MAX_STEP:
        raise InvalidInput(f"rank {body.rank} must be between 0 and {MAX_STEP}")
    if body.at_step is not None and not 0 <= body.at_step <= MAX_STEP:
        raise InvalidInput(f"at_step {body.at_step} must be between 0 and {MAX_STEP}")


def check_request(
    session: Session, body: DrillCreate, *, in_flight_after: datetime | None = None
) -> DrillTarget:
    """Everything the server can refuse, in the order an operator would fix it. A drill
    requested before ``in_flight_after`` no longer counts as running (its worker or follow-up
    was lost: it must not block the job's drills for ever)."""
    check_values(body)
    if session.exec(select(Job).where(Job.name == body.job)).first() is None:
        raise NotFound(f"no job named {body.job!r}: nothing injected")
    members = session.exec(
        select(Participant).where(Participant.job_name == body.job).order_by(col(Participant.rank))
    ).all()
    of_role = [p for p in members if p.role == body.role]
    if not of_role:
        roles = ", ".join(sorted({p.role for p in members})) or "none reported"
        raise InvalidInput(
            f"job {body.job!r} has no role {body.role!r} (its roles: {roles}): nothing injected"
        )
    target = (
        of_role[0] if body.rank is None else next((p for p in of_role if p.rank == body.rank), None)
    )
    if target is None:
        ranks = ", ".join(str(p.rank) for p in of_role)
        raise InvalidInput(
            f"job {body.job!r} has no {body.role} rank {body.rank} (ranks: "
            f"{ranks}): nothing injected"
        )
    held = session.exec(
        select(Incident.id).where(
            Incident.job == body.job,
            Incident.status == IncidentStatus.open.value,
            col(Incident.safe_mode).is_(True),
        )
    ).first()
    if held is not None:
        raise Conflict(
            f"job {body.job!r} is in SAFE_MODE (incident {held}): no drill until an "
            "approver releases it; nothing injected"
        )
    running = session.exec(
        select(Drill.id).where(
            Drill.job == body.job,
            col(Drill.plan).is_(False),
            col(Drill.status).in_(DrillStatus.in_flight()),
            col(Drill.requested_at) >= (in_flight_after or datetime.min.replace(tzinfo=UTC)),
        )
    ).first()
    if running is not None:
        raise Conflict(
            f"drill {running} is still running on job {body.job!r}: one drill at a "
            "time per job; nothing injected"
        )
    busy = _open_incident_of(session, body.job, body.role, target.rank)
    if busy is not None:
        raise Conflict(
            f"incident {busy} is still open for {body.role}-{target.rank} of job "
            f"{body.job!r}: drill a process once its last incident resolved (the "
            "drill's own incident could not be told apart); nothing injected"
        )
    if target.node_name is None:
        raise Conflict(
            f"no node reported {body.job}/{body.role}-{target.rank}: its node's "
            "launcher cannot be reached; nothing injected"
        )
    if target.phase in (EXITED_PHASE, *FINISHED_PHASES):
        raise Conflict(
            f"{body.role}-{target.rank} of job {body.job!r} is not running (phase "
            f"{target.phase}): nothing injected"
        )
    return DrillTarget(body.job, body.role, target.rank, target.node_name, body.fault, body.at_step)


def _open_incident_of(session: Session, job: str, role: str, rank: int) -> int | None:
    """An open incident of that process (its role, its rank or the whole role), if any."""
    for inc_id, subject in session.exec(
        select(Incident.id, Incident.subject).where(
            Incident.job == job, Incident.status == IncidentStatus.open.value
        )
    ).all():
        subject = subject or {}
        if subject.get("role") == role and subject.get("rank") in (None, rank, str(rank)):
            return inc_id
    return None
