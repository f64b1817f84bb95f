"""A drill's report, from what the server recorded: the incident its fault opened, the recovery
RLGuard ran, and the goodput ledger's figures for that incident (its lost time, redone steps
and the whole-job-restart counterfactual under the ledger's own assumptions).

Times count from the injection, which the launcher timed itself (``injected_at``), so the
detection delay is the real one, not the detector's estimate of when the fault began.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlmodel import Session, col, select

from app.core.config import Settings
from app.goodput.public import IncidentGoodput
from app.goodput.queries import job_goodput
from app.models.action import ActionStatus, RecoveryAction
from app.models.drill import Drill
from app.models.incident import Incident, IncidentStatus

# The ledger is read from this long before the injection: the job's typical step time and its
# newest checkpoint at the fault come from the steps before it.
LEDGER_LOOKBACK = timedelta(hours=1)
# Action states of a plan that is not through yet.
_UNFINISHED = tuple(
    s.value
    for s in (
        ActionStatus.pending_approval,
        ActionStatus.pending,
        ActionStatus.dispatched,
        ActionStatus.running,
    )
)


def primary_incident(session: Session, row: Drill) -> Incident | None:
    """The incident that speaks for the drill: the first one opened for its process (else the
    first one its fault opened at all)."""
    incs = [session.get(Incident, i) for i in row.incident_ids or []]
    found = [i for i in incs if i is not None]
    mine = [i for i in found if (i.subject or {}).get("role") == row.role]
    pick = sorted(mine or found, key=lambda i: (i.opened_at, i.id or 0))
    return pick[0] if pick else None


def _seconds(later: datetime | None, earlier: datetime) -> float | None:
    return None if later is None else round((later - earlier).total_seconds(), 3)


def build_report(
    session: Session, row: Drill, *, now: datetime, settings: Settings
) -> dict[str, Any]:
    """The report as far as the drill got by ``now`` (``recovered``: the job made a new step)."""
    injected = row.injected_at or row.requested_at
    inc = primary_incident(session, row)
    base: dict[str, Any] = {
        "injected_at": injected.isoformat(),
        "what": (row.answer or {}).get("what", ""),
        "counted_in_ettr": False,
        "incident": None,
        "detection_delay_seconds": None,
        "actions": [],
        "recovered": False,
        "time_to_first_new_step_seconds": None,
        "steps_redone": None,
        "generations_redone": None,
        # Counted on the node once the drill is over (app.drills.figures).
        "generations_note": "counted on the node when the drill is over",
        "seconds_lost": None,
        "whole_job_restart": None,
    }
    if inc is None:
        base["state"] = "no incident yet: RLGuard has not detected the fault"
        return base
    assert inc.id is not None
    base["incident"] = {
        "id": inc.id,
        "kind": inc.kind,
        "tier": inc.tier,
        "status": inc.status,
        "summary": inc.summary,
    }
    base["detection_delay_seconds"] = _seconds(inc.opened_at, injected)
    actions = session.exec(
        select(RecoveryAction)
        .where(RecoveryAction.incident_id == inc.id)
        .order_by(col(RecoveryAction.id))
    ).all()
    base["actions"] = [
        {
            "action": a.action,
            "status": a.status,
            "finished_after_seconds": _seconds(a.finished_at, injected),
        }
        for a in actions
    ]
    ledger = job_goodput(
        session,
        job=row.job,
        since=injected - LEDGER_LOOKBACK,
        until=now,
        now=now,
        settings=settings,
    )
    cost = next((r for r in ledger.incidents if r.id == inc.id), None)
    if cost is None:
        base["state"] = f"incident {inc.id} is not in the ledger yet"
        return base
    base.update(_ledger_figures(cost, injected))
    # A new step alone is not a recovery while the plan still waits (a heavy plan for an
    # approver, SAFE_MODE reached a step later): the job may step once more before it holds.
    waiting = any(a.status in _UNFINISHED for a in actions) or (
        inc.safe_mode and inc.status == IncidentStatus.open.value
    )
    if waiting:
        base.update(recovered=False, time_to_first_new_step_seconds=None)
    base["job_ettr"] = ledger.ettr
    base["counterfactual_assumptions"] = ledger.counterfactual.assumptions.summary
    base["state"] = _state(base, inc)
    return base


def _ledger_figures(cost: IncidentGoodput, injected: datetime) -> dict[str, Any]:
    return {
        "counted_in_ettr": not cost.drill,
        "recovered": cost.resumed_at is not None,
        "time_to_first_new_step_seconds": _seconds(cost.resumed_at, injected),
        "steps_redone": cost.steps_redone,
        "seconds_lost": round(cost.lost_seconds, 3),
        "segments": {k: round(v, 3) for k, v in cost.segments.items()},
        "whole_job_restart": {
            "seconds_lost": round(cost.whole_job_restart_seconds, 3),
            "steps_redone": cost.whole_job_restart_steps_redone,
        },
    }


def _state(report: dict[str, Any], inc: Incident) -> str:
    if report["recovered"]:
        return "recovered: the job made a new step"
    pending = [a["action"] for a in report["actions"] if a["status"] in _UNFINISHED]
    if any(a["status"] == "pending_approval" for a in report["actions"]):
        return f"waiting for an approver ({', '.join(pending)})"
    if inc.safe_mode:
        return "the job is in SAFE_MODE"
    if pending:
        return f"recovering ({', '.join(pending)})"
    return "waiting for the job's first new step"
