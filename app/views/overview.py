"""Overview: node grid, open incidents, jobs, pending approvals. Its parts poll."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.goodput.dashboard import cluster_tiles
from app.guardrails.automation import switches_by_job
from app.incidents import queries as incident_queries
from app.models import utcnow
from app.models.incident_public import IncidentPublic
from app.policy.signals import Tier
from app.views.context import DbDep, PageContext, Runtime, RuntimeDep, SignedInDep
from app.views.guardrails import breakers_data
from app.views.models.incidents import (
    open_incident_counts,
    open_tiers_by_node,
    safe_mode_jobs,
)
from app.views.models.overview import job_rows, overview_health
from app.views.rendering import render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 3


def _health(rt: Runtime, session: Any, page: PageContext) -> dict[str, Any]:
    return {
        "health": overview_health(
            caches=rt.caches,
            session=session,
            store=rt.store,
            now=page.now,
            suspect_after=rt.suspect_after,
            confirm_after=rt.confirm_after,
            incident_tiers_by_node=open_tiers_by_node(session),
        ),
        "incident_counts": open_incident_counts(session),
        "poll_seconds": POLL_SECONDS,
        "pending_approvals": page.pending_approvals,
    }


def _jobs(rt: Runtime, session: Any, page: PageContext) -> dict[str, Any]:
    return {
        "jobs": job_rows(
            session=session,
            now=page.now,
            suspect_after=rt.suspect_after,
            confirm_after=rt.confirm_after,
            safe_mode_jobs=safe_mode_jobs(session),
            switches=switches_by_job(session),
        ),
        "poll_seconds": POLL_SECONDS,
    }


OVERVIEW_INCIDENTS = 12
GOODPUT_POLL_SECONDS = 60


def _goodput(rt: Runtime, session: Any) -> dict[str, Any]:
    return {
        "cluster_ettr": cluster_tiles(session, now=utcnow(), settings=rt.settings),
        "goodput_poll_seconds": GOODPUT_POLL_SECONDS,
    }


def _incidents(session: Any) -> dict[str, Any]:
    result = incident_queries.list_incidents(session, status="open", limit=OVERVIEW_INCIDENTS)
    rows = sorted(result.incidents, key=_most_severe_then_newest)
    return {"open_incidents": rows, "open_total": result.count, "poll_seconds": POLL_SECONDS}


def _most_severe_then_newest(inc: IncidentPublic) -> tuple[int, float]:
    try:
        severity = -Tier(inc.tier).rank
    except ValueError:
        severity = 1  # a tier this server does not know sorts after the known ones
    return severity, -inc.updated_at.timestamp()


@router.get("/", response_class=HTMLResponse)
def overview_page(
    request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    data: dict[str, Any] = {"active_nav": "overview"}
    data.update(_health(rt, session, page))
    data.update(_jobs(rt, session, page))
    data.update(_incidents(session))
    data.update(_goodput(rt, session))
    data.update(breakers_data(session, page))
    return render(request, page, "pages/overview.html", data)


@router.get("/ui/overview/goodput", response_class=HTMLResponse)
def overview_goodput_partial(
    request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    return render(request, page, "partials/_overview_goodput.html", _goodput(rt, session))


@router.get("/ui/overview/health", response_class=HTMLResponse)
def overview_health_partial(
    request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    return render(request, page, "partials/_overview_health.html", _health(rt, session, page))


@router.get("/ui/overview/jobs", response_class=HTMLResponse)
def overview_jobs_partial(
    request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    return render(request, page, "partials/_overview_jobs.html", _jobs(rt, session, page))


@router.get("/ui/overview/incidents", response_class=HTMLResponse)
def overview_incidents_partial(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    return render(request, page, "partials/_overview_incidents.html", _incidents(session))
