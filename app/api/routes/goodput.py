"""A job's goodput ledger: ETTR, GPU-hours lost per incident, and what RLGuard saved."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import SessionDep, SettingsDep, ViewerUser
from app.goodput.public import JobGoodput
from app.goodput.queries import job_goodput
from app.goodput.window import parse_window
from app.models import utcnow

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])

_WHEN = "a duration before now (`7d`, `24h`, `30m`) or an ISO 8601 instant with a time zone"


@router.get(
    "/{job}/goodput",
    response_model=JobGoodput,
    summary="The job's goodput ledger: ETTR, time and GPU-hours lost per incident, savings",
    description=(
        "Per incident: productive time lost from the last step before the fault to the first "
        "new step after its recovery, split into detect / approve / recover / redo (seconds). "
        "Per job over the window: ETTR = productive / wall time (overlapping incidents count "
        "once; no fault: 1.0), GPU-hours and money lost, and the counterfactual whole-job "
        "restart with its assumptions. 422 for a bad `since`/`until`, 404 for an unknown job."
    ),
)
def get_job_goodput(
    job: str,
    session: SessionDep,
    settings: SettingsDep,
    _user: ViewerUser,
    since: Annotated[str | None, Query(description=f"window start: {_WHEN}; default 24h")] = None,
    until: Annotated[str | None, Query(description=f"window end: {_WHEN}; default now")] = None,
) -> JobGoodput:
    now = utcnow()
    start, end = parse_window(since, until, now=now)
    return job_goodput(session, job=job, since=start, until=end, now=now, settings=settings)
