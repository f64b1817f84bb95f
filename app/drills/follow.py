"""After the injection: which incidents the fault opened, and when the drill is over.

Each pass (a Celery task on the cluster queue, every ``follow_interval_seconds``) links the
incidents of the drill's job that opened since the injection for its process (same role, its
rank or none) or for the job as a whole, marks each on its timeline as a drill (so the ledger
leaves it out of the ETTR, and a reader knows it was on purpose), and writes the report. The
drill is over when the job made a new step after the recovery (``recovered``) or when
``follow_timeout_seconds`` passed (``unrecovered``: the report says how far it got); its
node then counts the generations the job did again (:mod:`app.drills.figures`), which ends it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlmodel import Session, col, select

from app.core.config import Settings
from app.drills.figures import waits_for_count
from app.drills.report import build_report
from app.drills.service import get_drill
from app.incidents.timeline import add_event
from app.models.drill import Drill, DrillStatus
from app.models.incident import Incident, IncidentEventType

# An incident opened this long before the launcher's clock said "injected" is still the drill's
# (the server's and the node's clocks differ a little; a detector never sees a fault early).
CLOCK_SLACK = timedelta(seconds=2)


def _caused_by(row: Drill, inc: Incident) -> bool:
    subject = inc.subject or {}
    role, rank = subject.get("role"), subject.get("rank")
    if role is None:
        return "node" not in subject and "gpu" not in subject  # the job's own, not a machine's
    return role == row.role and (rank is None or str(rank) == str(row.rank))


def link_incidents(session: Session, row: Drill, *, now: datetime) -> list[int]:
    """Link and mark the incidents the drill's fault opened since the last pass; their ids."""
    injected = row.injected_at or row.requested_at
    found = session.exec(
        select(Incident)
        .where(
            Incident.job == row.job,
            col(Incident.opened_at) >= injected - CLOCK_SLACK,
            col(Incident.opened_at) <= now,
        )
        .order_by(col(Incident.id))
    ).all()
    known = set(row.incident_ids or [])
    new = [i for i in found if i.id not in known and _caused_by(row, i)]
    for inc in new:
        add_event(
            session,
            incident_id=inc.id,
            type_=IncidentEventType.DRILL,
            actor=f"drill:{row.id}",
            at=now,
            detail={
                "drill": row.id,
                "fault": row.fault,
                "role": row.role,
                "rank": row.rank,
                "requested_by": row.requested_by,
            },
        )
    if new:
        row.incident_ids = [*(row.incident_ids or []), *(i.id for i in new if i.id is not None)]
    return [i.id for i in new if i.id is not None]


def follow_drill(session: Session, drill_id: int, *, now: datetime, settings: Settings) -> bool:
    """One pass; True when the drill is over (nothing more to follow). The caller commits."""
    row = get_drill(session, drill_id)
    if row.status != DrillStatus.injected.value or "outcome" in (row.report or {}):
        return True
    link_incidents(session, row, now=now)
    report = build_report(session, row, now=now, settings=settings)
    row.report = report
    injected = row.injected_at or row.requested_at
    over = timedelta(seconds=settings.drills.follow_timeout_seconds) <= now - injected
    if report["recovered"] or over:
        # Not finished yet: the generations redone are counted on the node next
        # (:mod:`app.drills.figures`), which sets this outcome.
        outcome = DrillStatus.recovered if report["recovered"] else DrillStatus.unrecovered
        row.report = {
            **report,
            "outcome": outcome.value,
            "state": f"{report.get('state', outcome.value)}; counting the "
            f"generations redone on node {row.node}",
        }
    session.add(row)
    return "outcome" in row.report


def awaiting_figures(session: Session, drill_id: int) -> str | None:
    """The node that is to count the generations redone of this drill, when it is over and
    waits for them (:mod:`app.drills.figures` ends it); else None."""
    row = get_drill(session, drill_id)
    return row.node if waits_for_count(row) else None
