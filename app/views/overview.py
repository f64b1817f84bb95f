"""Overview: node grid, open incidents, jobs, pending approvals. Its parts poll.

Up to ``dashboard.fleet_view_above_nodes`` nodes the page carries everything (one card per node
with sparklines); above it, the fleet view (``app/views/fleet.py``): the first response is the
filter form and empty panels that fetch their partials lazily."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from sqlmodel import Session

from app.guardrails.automation import switches_by_job
from app.incidents import queries as incident_queries
from app.incidents.public import IncidentPublic
from app.policy.signals import Tier
from app.views.context import DbDep, PageContext, Runtime, RuntimeDep, SignedInDep
from app.views.fleet import FiltersDep, GridPageParam, PageParam, is_fleet, shell_data
from app.views.guardrails import breakers_data
from app.views.models.ettr_tiles import cluster_tiles_shared
from app.views.models.fleet import FleetFilters, paginate
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
            incident_tiers_by_node=open_tiers_by_node(session),
            **rt.liveness(page.now),
        ),
        "incident_counts": open_incident_counts(session),
        "poll_seconds": POLL_SECONDS,
        "pending_approvals": page.pending_approvals,
    }


def _jobs(rt: Runtime, session: Any, page: PageContext) -> dict[str, Any]:
    return {
        "jobs": job_rows(
            session=session,
            safe_mode_jobs=safe_mode_jobs(session),
            switches=switches_by_job(session),
            **rt.liveness(page.now),
        ),
        "poll_seconds": POLL_SECONDS,
    }


OVERVIEW_INCIDENTS = 12
GOODPUT_POLL_SECONDS = 60


def _goodput(rt: Runtime, session: Any) -> dict[str, Any]:
    return {
        "cluster_ettr": cluster_tiles_shared(
            rt.caches, session, settings=rt.settings, now=time.time()
        ),
        "goodput_poll_seconds": GOODPUT_POLL_SECONDS,
    }


def _incidents(session: Session, filters: FleetFilters, page: int) -> dict[str, Any]:
    """A page of open incidents (newest first, the worst of them first on the page), narrowed
    by the fleet filters' job and tier."""
    result = incident_queries.list_incidents(
        session,
        status="open",
        tier=filters.tier or None,
        job=filters.job or None,
        limit=OVERVIEW_INCIDENTS,
        offset=(page - 1) * OVERVIEW_INCIDENTS,
    )
    # The pager from the count; a page past the end (the list shrank) shows the last one.
    _, pager = paginate(range(result.count), page=page, size=OVERVIEW_INCIDENTS)
    if pager.page != page and result.count:
        return _incidents(session, filters, pager.page)
    rows = sorted(result.incidents, key=_most_severe_then_newest)
    return {
        "open_incidents": rows,
        "open_total": result.count,
        "incidents_pager": pager,
        "incidents_filters": filters,
        "poll_seconds": POLL_SECONDS,
    }


def _most_severe_then_newest(inc: IncidentPublic) -> tuple[int, float]:
    try:
        severity = -Tier(inc.tier).rank
    except ValueError:
        severity = 1  # a tier this server does not know sorts after the known ones
    return severity, -inc.updated_at.timestamp()


@router.get("/", response_class=HTMLResponse)
def overview_page(
    request: Request,
    page: SignedInDep,
    rt: RuntimeDep,
    session: DbDep,
    filters: FiltersDep,
    grid_page: GridPageParam = 1,
    nodes_page: PageParam = 1,
    incidents_page: PageParam = 1,
) -> HTMLResponse:
    data: dict[str, Any] = {"active_nav": "overview", "fleet": False}
    if is_fleet(rt, session):
        data.update(shell_data(session, filters, page=grid_page, nodes_page=nodes_page))
        data["incidents_query"] = filters.query(incidents_page=incidents_page)
        return render(request, page, "pages/overview.html", data)
    # The node cards: everything in this one response (the filters are the fleet view's).
    data.update(_health(rt, session, page))
    data.update(_jobs(rt, session, page))
    data.update(_incidents(session, FleetFilters(), incidents_page))
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
def overview_incidents_partial(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    filters: FiltersDep,
    incidents_page: PageParam = 1,
) -> HTMLResponse:
    data = _incidents(session, filters, incidents_page)
    return render(request, page, "partials/_overview_incidents.html", data)
