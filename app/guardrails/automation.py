"""Each job's automation switches: dry run (plan and show, never act) and hands off (no
automatic action at all, e.g. while people work on the job by hand). Every change is audited."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session, select

from app.auth.audit import record_audit
from app.core.errors import Forbidden, InvalidInput, NotFound
from app.models import Job, Role, User
from app.models._types import utcnow
from app.models.guardrails import JobAutomation

# Dry run only stops actions and shows what they would do: an operator may turn it on or off.
# Hands off stops automatic recovery of a live job, which is an approver's call.
DRY_RUN_ROLE = Role.operator
HANDS_OFF_ROLE = Role.approver


@dataclass(frozen=True, slots=True)
class Switches:
    dry_run: bool = False
    hands_off: bool = False


def switches_of(session: Session, job: str | None) -> Switches:
    row = session.get(JobAutomation, job) if job else None
    return Switches(row.dry_run, row.hands_off) if row is not None else Switches()


def switches_by_job(session: Session) -> dict[str, Switches]:
    """Every job's stored switches; a job missing here has both off."""
    return {
        r.job_name: Switches(r.dry_run, r.hands_off) for r in session.exec(select(JobAutomation))
    }


def get_job_automation(session: Session, *, job: str) -> JobAutomation:
    """The job's switches (both off for a job that has none stored); 404 for an unknown job."""
    if not _job_exists(session, job):
        raise NotFound(f"job {job!r} not found")
    return session.get(JobAutomation, job) or JobAutomation(job_name=job, updated_by="")


def set_job_automation(
    session: Session,
    *,
    job: str,
    user: User,
    dry_run: bool | None = None,
    hands_off: bool | None = None,
    reason: str = "",
    now: datetime | None = None,
) -> JobAutomation:
    """Change the switches given (None: unchanged); checks the user's role per switch, writes
    the audit row with the change, and flushes. Nothing is stored when any check fails."""
    if dry_run is None and hands_off is None:
        raise InvalidInput("nothing to change: give dry_run, hands_off or both")
    if not _job_exists(session, job):
        raise NotFound(f"job {job!r} not found")
    role = Role(user.role)
    if dry_run is not None and not role.allows(DRY_RUN_ROLE):
        raise Forbidden(f"dry_run needs the {DRY_RUN_ROLE.value} role; {user.name} is {user.role}")
    if hands_off is not None and not role.allows(HANDS_OFF_ROLE):
        raise Forbidden(
            f"hands_off needs the {HANDS_OFF_ROLE.value} role; {user.name} is {user.role}"
        )
    row = session.get(JobAutomation, job) or JobAutomation(job_name=job)
    before = {"dry_run": row.dry_run, "hands_off": row.hands_off}
    if dry_run is not None:
        row.dry_run = dry_run
    if hands_off is not None:
        row.hands_off = hands_off
    row.updated_at, row.updated_by = now or utcnow(), f"user:{user.name}"
    session.add(row)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="job.automation",
        target=f"job:{job}",
        detail={
            "before": before,
            "after": {"dry_run": row.dry_run, "hands_off": row.hands_off},
            "reason": reason,
        },
    )
    session.flush()
    return row


def _job_exists(session: Session, job: str) -> bool:
    return session.exec(select(Job.id).where(Job.name == job)).first() is not None
