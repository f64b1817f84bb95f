"""Job page: participants (polling), golden metrics with their bands, progress."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.core.errors import NotFound
from app.goodput.dashboard import WINDOWS, goodput_panel
from app.goodput.queries import job_goodput
from app.goodput.window import parse_instant
from app.incidents import queries as incident_queries
from app.models import utcnow
from app.views.context import DbDep, Runtime, RuntimeDep, SignedInDep
from app.views.guardrails import switches_data
from app.views.models.engines import engine_rows
from app.views.models.jobs import (
    HISTORY_MINUTES,
    job_detail,
    participant_rows,
)
from app.views.models.phases import KNOWN_PHASES
from app.views.rendering import error_page, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 3
JOB_INCIDENTS = 10
GOODPUT_POLL_SECONDS = 60


def _goodput(rt: Runtime, session: Any, *, job: str, window: str | None) -> dict[str, Any]:
    """The goodput panel's data; raises NotFound for an unknown job."""
    window = window if window in WINDOWS else "24h"
    now = utcnow()
    since = parse_instant("window", window, now=now)
    ledger = job_goodput(session, job=job, since=since, until=now, now=now, settings=rt.settings)
    return {
        "goodput": goodput_panel(ledger, window=window),
        "goodput_windows": list(WINDOWS),
        "goodput_poll_seconds": GOODPUT_POLL_SECONDS,
    }


@router.get("/jobs/{name}", response_class=HTMLResponse)
def job_page(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    try:
        job = job_detail(
            session=session, store=rt.store, name=name, policy=rt.policy, **rt.liveness(page.now)
        )
    except NotFound as exc:
        return error_page(request, page, "Unknown job", str(exc), status_code=404)
    incidents = incident_queries.list_incidents(
        session, status="all", job=name, limit=JOB_INCIDENTS
    )
    data: dict[str, Any] = {
        "job": job,
        "job_incidents": incidents.incidents,
        "participants": job.participants,
        "engines": engine_rows(session, rt.store, job=name, now=page.now),
        "job_name": job.name,
        "poll_seconds": POLL_SECONDS,
        "history_minutes": HISTORY_MINUTES,
        "known_phases": KNOWN_PHASES,
        "active_nav": "overview",
    }
    data.update(_goodput(rt, session, job=name, window=request.query_params.get("goodput")))
    data.update(switches_data(session, page, name))
    return render(request, page, "pages/job.html", data)


@router.get("/ui/jobs/{name}/goodput", response_class=HTMLResponse)
def job_goodput_partial(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    try:
        data = _goodput(rt, session, job=name, window=request.query_params.get("window"))
    except NotFound as exc:
        return error_page(request, page, "Unknown job", str(exc), status_code=404)
    data["job_name"] = name
    return render(request, page, "partials/_job_goodput.html", data)


@router.get("/ui/jobs/{name}/participants", response_class=HTMLResponse)
def job_participants_partial(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    try:
        rows = participant_rows(session, job=name, **rt.liveness(page.now))
    except NotFound as exc:
        return error_page(request, page, "Unknown job", str(exc), status_code=404)
    return render(
        request,
        page,
        "partials/_job_participants.html",
        {"participants": rows, "job_name": name, "poll_seconds": POLL_SECONDS},
    )


@router.get("/ui/jobs/{name}/engines", response_class=HTMLResponse)
def job_engines_partial(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    try:
        rows = engine_rows(session, rt.store, job=name, now=page.now)
    except NotFound as exc:
        return error_page(request, page, "Unknown job", str(exc), status_code=404)
    return render(
        request,
        page,
        "partials/_job_engines.html",
        {"engines": rows, "job_name": name, "poll_seconds": POLL_SECONDS},
    )
