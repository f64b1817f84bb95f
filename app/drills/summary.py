"""A drill's report as the figures an operator reads, in words (the Drills page's rows; the
CLI prints the same figures as lines): each figure or why there is none yet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session, select

from app.core.errors import InvalidInput, NotFound
from app.drills.figures import generations_text
from app.drills.public import DrillPublic
from app.drills.service import drill_public, list_drills
from app.models import Job
from recovery.supervision.requests import JOB_DIR_PATTERN

# A status's colour on the page (the dashboard's badge levels).
STATUS_LEVELS = {
    "recovered": "ok",
    "unrecovered": "bad",
    "refused": "idle",
    "requested": "warn",
    "injected": "warn",
    "planned": "idle",
}


@dataclass(frozen=True, slots=True)
class DrillSummary:
    drill: DrillPublic
    level: str
    # (label, text) in the report's order: detection delay ... whole-job restart.
    figures: list[tuple[str, str]]


def _seconds(value: Any) -> str:
    return "—" if value is None else f"{float(value):.1f} s"


def report_figures(rep: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's figures as text; a dash for one not reached (or not applicable)."""
    inc = rep.get("incident")
    cf = rep.get("whole_job_restart")
    actions = ", ".join(f"{a['action']}: {a['status']}" for a in rep.get("actions") or [])
    redone = rep.get("steps_redone")
    return [
        (
            "incident",
            f"#{inc['id']} {inc['kind']} ({inc['tier']}, {inc['status']})" if inc else "none",
        ),
        ("detection delay", _seconds(rep.get("detection_delay_seconds"))),
        ("action", actions or "none"),
        ("first new step", _seconds(rep.get("time_to_first_new_step_seconds"))),
        ("steps redone", "—" if redone is None else str(redone)),
        ("generations redone", generations_text(rep)),
        ("seconds lost", _seconds(rep.get("seconds_lost"))),
        (
            "whole-job restart",
            f"{_seconds(cf['seconds_lost'])} lost, {cf['steps_redone']} steps redone"
            if cf
            else "—",
        ),
    ]


def check_job_filter(session: Session, job: str | None) -> str | None:
    """``job`` as a filter of the list: raises naming it when it is not a job's name or no
    such job is known (an empty value is no filter)."""
    if not job:
        return None
    if not JOB_DIR_PATTERN.fullmatch(job):
        raise InvalidInput(f"job {job[:64]!r} is not a job name (letters, digits, '.', '_', '-')")
    if session.exec(select(Job.name).where(Job.name == job)).first() is None:
        raise NotFound(f"no job named {job!r}")
    return job


def drill_summaries(session: Session, *, job: str | None, limit: int = 100) -> list[DrillSummary]:
    """Past and running drills (not plans), newest first, with their figures."""
    out = []
    for row in list_drills(session, job=job, limit=limit):
        public = drill_public(row)
        out.append(
            DrillSummary(
                public, STATUS_LEVELS.get(public.status, "idle"), report_figures(public.report)
            )
        )
    return out
