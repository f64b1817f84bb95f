"""Audit log and (read-only) settings."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.alerts import service as alerts_service
from app.alerts.errors import AlertConfigError
from app.api.deps import SqlInt
from app.auth.audit import AUDIT_READER_ROLE
from app.views.context import DbDep, RuntimeDep, SignedInDep
from app.views.models.admin import BadFilter, audit_page, settings_view
from app.views.rendering import error_page, is_htmx, render

router = APIRouter(include_in_schema=False)


@router.get("/audit", response_class=HTMLResponse)
def audit(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    actor: str = "",
    action: str = "",
    # (below 1: the audit page's own 400 page, which says what a valid id is)
    before: Annotated[SqlInt | None, Query()] = None,
) -> HTMLResponse:
    assert page.user is not None  # SignedInDep guarantees it
    if not page.user.can_read_audit:
        message = (
            f"the audit log needs the {AUDIT_READER_ROLE.value} role; "
            f"{page.user.name} is {page.user.role}"
        )
        return error_page(request, page, "Not allowed", message, status_code=403)
    try:
        result = audit_page(session, actor=actor.strip(), action=action.strip(), before_id=before)
    except BadFilter as exc:
        return error_page(request, page, "Bad filter", str(exc), status_code=400)
    template = "partials/_audit_table.html" if is_htmx(request) else "pages/audit.html"
    return render(
        request, page, template, {"audit": result, "active_nav": "audit"}, vary_on_hx=True
    )


@router.get("/settings", response_class=HTMLResponse)
def settings_page(request: Request, page: SignedInDep, rt: RuntimeDep) -> HTMLResponse:
    channels_error = None
    try:
        # Masked contacts (public()'s default): the page shows no phone numbers to anyone.
        channels = [c.public() for c in alerts_service.current_config().channels]
    except AlertConfigError as exc:
        channels, channels_error = [], str(exc)
    view = settings_view(rt.settings, policy=rt.policy, channels=channels)
    return render(
        request,
        page,
        "pages/settings.html",
        {"settings": view, "channels_error": channels_error, "active_nav": "settings"},
    )
