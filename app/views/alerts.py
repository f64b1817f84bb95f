"""Alerts: the delivery log (what was sent where, how many tries, what the channel answered)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.alerts import service as alerts_service
from app.alerts.errors import AlertEventError
from app.api.deps import RowId
from app.models.alert import DeliveryState
from app.views.context import DbDep, SignedInDep
from app.views.rendering import error_page, is_htmx, render

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 50
STATE_LEVELS = {
    "sent": "ok",
    "grouped": "idle",
    "pending": "idle",
    "sending": "warn",
    "retrying": "warn",
    "failed": "bad",
    "rejected": "bad",
    "suppressed": "idle",
}


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    state: str = "",
    channel: str = "",
    incident: Annotated[RowId | None, Query()] = None,
    before: Annotated[RowId | None, Query()] = None,
) -> HTMLResponse:
    state, channel = state.strip(), channel.strip()[:64]
    try:
        rows = alerts_service.list_deliveries(
            session,
            incident_id=incident,
            channel=channel or None,
            state=state or None,
            limit=PAGE_SIZE + 1,
            before_id=before,
        )
    except AlertEventError as exc:
        return error_page(request, page, "Bad filter", str(exc), status_code=400)
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    data = {
        "deliveries": rows,
        "next_before": rows[-1].id if more and rows else None,
        "filters": {"state": state, "channel": channel, "incident": incident or ""},
        "states": [s.value for s in DeliveryState],
        "state_levels": STATE_LEVELS,
        "active_nav": "alerts",
    }
    template = "partials/_alerts_table.html" if is_htmx(request) else "pages/alerts.html"
    return render(request, page, template, data, vary_on_hx=True)
