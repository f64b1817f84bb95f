"""Login form, session cookie, logout."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.api.deps import LoginThrottleDep
from app.auth import web as web_auth
from app.core.errors import TooManyRequests
from app.views.context import CsrfDep, DbDep, PageDep
from app.views.models.accounts import LoginRefused, sign_in, sign_out
from app.views.rendering import SECURITY_HEADERS, render, set_csrf_cookie

router = APIRouter(include_in_schema=False)


def safe_next(target: str | None) -> str:
    """Only a path on this site: never an absolute or protocol-relative URL (open redirect)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, page: PageDep, next: str | None = None) -> HTMLResponse:
    if page.user is not None:
        return RedirectResponse(safe_next(next), status_code=303)  # type: ignore[return-value]
    return render(
        request, page, "pages/login.html", {"next": safe_next(next), "error": None, "name": ""}
    )


@router.post("/login", response_class=HTMLResponse, dependencies=[CsrfDep])
def login_submit(
    request: Request,
    page: PageDep,
    session: DbDep,
    throttle: LoginThrottleDep,
    username: Annotated[str, Form(max_length=256)] = "",
    password: Annotated[str, Form(max_length=4096)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> HTMLResponse:
    client = request.client.host if request.client else "unknown"
    try:
        session_id = sign_in(
            session, name=username, password=password, client=client, throttle=throttle
        )
    except (LoginRefused, TooManyRequests) as exc:
        status, headers = 401, {}
        if isinstance(exc, TooManyRequests):
            status, headers = 429, {"Retry-After": str(exc.retry_after)}
        return render(
            request,
            page,
            "pages/login.html",
            {"next": safe_next(next), "error": str(exc), "name": username[:64]},
            status_code=status,
            headers=headers,
        )
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(
        web_auth.session_cookie_name(page.secure),
        session_id,
        max_age=web_auth.SESSION_MAX_AGE_SECONDS,
        httponly=True,
        samesite="lax",
        secure=page.secure,
        path="/",
    )
    # CSRF tokens are bound to the new session from here on; the pre-login nonce is replaced
    # too, so a token seen by anyone before sign-in is worthless after it.
    set_csrf_cookie(response, web_auth.new_csrf_nonce(), secure=page.secure)  # type: ignore[arg-type]
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response  # type: ignore[return-value]


@router.post("/logout", dependencies=[CsrfDep])
def logout(page: PageDep, session: DbDep) -> RedirectResponse:
    # The session ends on the server, not just in this browser: a copy of the cookie is now
    # worthless on every replica.
    if page.user is not None and page.session_id is not None:
        sign_out(session, session_id=page.session_id, name=page.user.name)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        web_auth.session_cookie_name(page.secure),
        path="/",
        httponly=True,
        samesite="lax",
        secure=page.secure,
    )
    return response
