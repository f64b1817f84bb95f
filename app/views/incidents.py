"""Incidents: filterable list (polling), detail with evidence, timeline, actions and approvals."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.api.deps import RowId
from app.core.errors import InvalidInput, NotFound
from app.incidents import queries as incident_queries
from app.views.context import DbDep, SignedInDep
from app.views.models.incidents import incident_page
from app.views.rendering import error_page, is_htmx, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 3
MAX_JOB_FILTER = 128


@router.get("/incidents", response_class=HTMLResponse)
def incidents_list(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    status: str = "open",
    tier: str = "",
    job: str = "",
) -> HTMLResponse:
    status, tier, job = status.strip() or "open", tier.strip(), job.strip()
    if len(job) > MAX_JOB_FILTER:
        return error_page(
            request,
            page,
            "Bad filter",
            f"job filter is longer than {MAX_JOB_FILTER} characters",
            status_code=400,
        )
    try:
        result = incident_queries.list_incidents(
            session, status=status, tier=tier or None, job=job or None, limit=200
        )
    except InvalidInput as exc:
        return error_page(request, page, "Bad filter", str(exc), status_code=400)
    filters = {"status": status, "tier": tier, "job": job}
    data: dict[str, Any] = {
        "incidents": result.incidents,
        "total": result.count,
        "filters": filters,
        "query": urlencode({k: v for k, v in filters.items() if v}),
        "poll_seconds": POLL_SECONDS,
        "active_nav": "incidents",
    }
    template = "partials/_incident_list.html" if is_htmx(request) else "pages/incidents.html"
    return render(request, page, template, data, vary_on_hx=True)


def _detail(
    request: Request, page: Any, session: Any, incident_id: int, template: str
) -> HTMLResponse:
    try:
        view = incident_page(
            session,
            incident_id=incident_id,
            store=request.app.state.series_store,
            policy=request.app.state.policy,
        )
    except NotFound as exc:
        return error_page(request, page, "Unknown incident", str(exc), status_code=404)
    return render(
        request,
        page,
        template,
        {
            "view": view,
            "inc": view.incident,
            "poll_seconds": POLL_SECONDS,
            "active_nav": "incidents",
        },
    )


@router.get("/incidents/{incident_id}", response_class=HTMLResponse)
def incident_detail_page(
    incident_id: RowId, request: Request, page: SignedInDep, session: DbDep
) -> HTMLResponse:
    return _detail(request, page, session, incident_id, "pages/incident.html")


@router.get("/ui/incidents/{incident_id}/timeline", response_class=HTMLResponse)
def incident_timeline_partial(
    incident_id: RowId, request: Request, page: SignedInDep, session: DbDep
) -> HTMLResponse:
    return _detail(request, page, session, incident_id, "partials/_incident_timeline.html")
