"""Audit log and (read-only) settings."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from app.services.dashboard.admin import BadFilter, audit_page, settings_view
from app.views.context import DbDep, RuntimeDep, SignedInDep
from app.views.rendering import is_htmx, render

router = APIRouter(include_in_schema=False)


@router.get("/audit", response_class=HTMLResponse)
def audit(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    actor: str = "",
    action: str = "",
    before: int | None = Query(default=None),
) -> HTMLResponse:
    try:
        result = audit_page(session, actor=actor.strip(), action=action.strip(), before_id=before)
    except BadFilter as exc:
        return render(
            request,
            page,
            "pages/error.html",
            {"title": "Bad filter", "message": str(exc)},
            status_code=400,
            headers={"X-RLGuard-Reason": str(exc)},
        )
    template = "partials/_audit_table.html" if is_htmx(request) else "pages/audit.html"
    return render(
        request, page, template, {"audit": result, "active_nav": "audit"}, vary_on_hx=True
    )


@router.get("/settings", response_class=HTMLResponse)
def settings_page(request: Request, page: SignedInDep, rt: RuntimeDep) -> HTMLResponse:
    state = request.app.state
    policy = getattr(state, "policy", None)
    alerts = getattr(state, "alerts_config", None)
    channels = [c.public() for c in alerts.channels] if alerts is not None else []
    view = settings_view(rt.settings, policy=policy, channels=channels)
    return render(
        request, page, "pages/settings.html", {"settings": view, "active_nav": "settings"}
    )
