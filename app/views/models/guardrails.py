"""Guard-rails on the dashboard: the breakers' state (Overview) and a job's automation switches
(its badges and toggles). What may change, and by whom, is app.guardrails'; this only reads."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from app.guardrails import automation, breaker
from app.models import Role
from app.models.guardrails import CircuitBreaker


@dataclass(frozen=True, slots=True)
class BreakerRow:
    scope: str
    job: str | None  # the job of a job breaker, None for the cluster's
    open: bool
    reason: str
    tripped_at: datetime | None
    trips: int
    incident_id: int | None
    reset_at: datetime | None
    reset_by: str | None

    @property
    def state(self) -> str:
        return "open" if self.open else "closed"

    @property
    def level(self) -> str:
        return "bad" if self.open else "ok"


@dataclass(frozen=True, slots=True)
class BreakerPanel:
    rows: list[BreakerRow]
    can_reset: bool  # the user may reset (the button is shown on open rows)

    @property
    def open_count(self) -> int:
        return sum(r.open for r in self.rows)


def _row(b: CircuitBreaker) -> BreakerRow:
    return BreakerRow(
        scope=b.scope,
        job=breaker.job_of(b.scope),
        open=b.open,
        reason=b.reason,
        tripped_at=b.tripped_at,
        trips=b.trips,
        incident_id=b.incident_id,
        reset_at=b.reset_at,
        reset_by=b.reset_by,
    )


def breaker_panel(session: Session, *, role: Role) -> BreakerPanel:
    """The cluster's breaker (closed when it never tripped) and every job breaker that has a
    row; open ones first."""
    rows = [_row(b) for b in breaker.list_breakers(session)]
    if not any(r.scope == breaker.CLUSTER_SCOPE for r in rows):
        rows.append(_row(CircuitBreaker(scope=breaker.CLUSTER_SCOPE)))
    return BreakerPanel(rows=rows, can_reset=role.allows(breaker.RESET_ROLE))


@dataclass(frozen=True, slots=True)
class JobSwitches:
    job: str
    dry_run: bool
    hands_off: bool
    updated_by: str
    updated_at: datetime | None
    can_dry_run: bool  # the user may switch dry run
    can_hands_off: bool  # the user may switch hands off
    dry_run_role: str
    hands_off_role: str


def job_switches(session: Session, *, job: str, role: Role) -> JobSwitches:
    """The job's switches and which of them this role may change; NotFound for an unknown job."""
    row = automation.get_job_automation(session, job=job)
    return JobSwitches(
        job=job,
        dry_run=row.dry_run,
        hands_off=row.hands_off,
        updated_by=row.updated_by,
        updated_at=row.updated_at if row.updated_by else None,
        can_dry_run=role.allows(automation.DRY_RUN_ROLE),
        can_hands_off=role.allows(automation.HANDS_OFF_ROLE),
        dry_run_role=automation.DRY_RUN_ROLE.value,
        hands_off_role=automation.HANDS_OFF_ROLE.value,
    )
