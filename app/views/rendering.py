"""Jinja environment and the one function every view renders through.

``render`` adds what every page needs (the user, the CSRF token for ``hx-headers``, the pending
approvals badge), sets the CSRF cookie when the browser has none yet, and sends the security
headers: pages may only run our own scripts, may not be framed (clickjacking an Approve button),
and are never cached by a shared cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from jinja2 import StrictUndefined
from sqlmodel import Session

from app.auth import web as web_auth
from app.core.errors import ServiceError
from app.views.context import PageContext

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
STATIC_DIR = Path(__file__).resolve().parents[1] / "static"

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _ago(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "never"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s ago"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m ago"
    return f"{s // 86400}d {(s % 86400) // 3600}h ago"


def _utc(value: datetime | float | None, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    if value is None:
        return "–"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    return value.astimezone(UTC).strftime(fmt)


def _num(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}{suffix}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
# A typo in a template is an error in the tests, not an empty string on an operator's screen.
templates.env.undefined = StrictUndefined
templates.env.filters["ago"] = _ago
templates.env.filters["utc"] = _utc
templates.env.filters["num"] = _num
templates.env.filters["pct"] = _pct
templates.env.globals["static_url"] = lambda path: f"/static/{path}"


def render(
    request: Request,
    page: PageContext,
    template: str,
    data: dict[str, Any] | None = None,
    *,
    status_code: int = 200,
    vary_on_hx: bool = False,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    context: dict[str, Any] = {
        "user": page.user,
        "csrf_token": page.csrf_token,
        "nav_pending_approvals": page.pending_approvals,
        "now_text": _utc(page.now) + " UTC",
        "now": page.now,
        "can_decide": page.can_decide,
    }
    context.update(data or {})
    response = templates.TemplateResponse(request, template, context, status_code=status_code)
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    if vary_on_hx:
        response.headers["Vary"] = "HX-Request"
    for name, value in (headers or {}).items():
        response.headers[name] = value
    if page.new_csrf_nonce:
        set_csrf_cookie(response, page.new_csrf_nonce, secure=page.secure)
    return response


def error_page(
    request: Request, page: PageContext, title: str, message: str, *, status_code: int
) -> HTMLResponse:
    """An error as a page for a browser; ``X-RLGuard-Reason`` carries it to htmx requests."""
    return render(
        request,
        page,
        "pages/error.html",
        {"title": title, "message": message},
        status_code=status_code,
        headers={"X-RLGuard-Reason": message[:200]},
    )


def commit_or_refusal(
    request: Request,
    page: PageContext,
    session: Session,
    title: str,
    change: Callable[[], object],
) -> HTMLResponse | None:
    """Runs a form's ``change`` and commits it (None). A ``ServiceError``, the service's refusal
    with its reason, rolls the session back and comes back as the error page ``title``."""
    try:
        change()
        session.commit()
    except ServiceError as exc:
        session.rollback()
        return error_page(request, page, title, str(exc), status_code=exc.status_code)
    return None


def after_change(
    request: Request,
    page: PageContext,
    back_to: str,
    template: str,
    data: Callable[[], dict[str, Any]],
) -> Response:
    """A plain form post goes back to ``back_to``; htmx gets ``template`` again, with what the
    change made (``data`` runs only then)."""
    if not is_htmx(request):
        return RedirectResponse(back_to, status_code=303)
    return render(request, page, template, data())


def set_csrf_cookie(response: HTMLResponse, nonce: str, *, secure: bool) -> None:
    response.set_cookie(
        web_auth.csrf_cookie_name(secure),
        nonce,
        httponly=True,
        samesite="lax",
        secure=secure,
        path="/",
    )


def is_htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"
