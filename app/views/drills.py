"""Drills: ``/drills`` (every job's, or ``?job=J``'s), the past and running ``rlguard drill``s
with their report figures, linked from each job's page. Read-only: a drill is asked for with
the CLI or the REST API (operators). The figures are the subsystem's (app.drills.summary)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.core.errors import InvalidInput, NotFound
from app.drills.summary import check_job_filter, drill_summaries
from app.views.context import DbDep, SignedInDep
from app.views.rendering import error_page, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 10


@router.get("/drills", response_class=HTMLResponse)
def drills_page(
    request: Request, page: SignedInDep, session: DbDep, job: str | None = None
) -> HTMLResponse:
    try:
        name = check_job_filter(session, job)
    except InvalidInput as exc:
        return error_page(request, page, "Bad request", str(exc), status_code=422)
    except NotFound as exc:
        return error_page(request, page, "No such job", str(exc), status_code=404)
    return render(
        request,
        page,
        "pages/drills.html",
        {
            "drills": drill_summaries(session, job=name),
            "job": name,
            "poll_seconds": POLL_SECONDS,
            "active_nav": "drills",
        },
    )
