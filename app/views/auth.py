"""Login form, session cookie, logout."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.services import web_auth
from app.services.dashboard.accounts import LoginRefused, record_logout, sign_in
from app.views.context import CsrfDep, DbDep, PageDep, RuntimeDep
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
    rt: RuntimeDep,
    session: DbDep,
    username: Annotated[str, Form(max_length=256)] = "",
    password: Annotated[str, Form(max_length=4096)] = "",
    next: Annotated[str, Form(max_length=2048)] = "/",
) -> HTMLResponse:
    client = request.client.host if request.client else "unknown"
    try:
        who = sign_in(session, name=username, password=password, client=client)
    except LoginRefused as exc:
        return render(
            request,
            page,
            "pages/login.html",
            {"next": safe_next(next), "error": str(exc), "name": username[:64]},
            status_code=401,
        )
    response = RedirectResponse(safe_next(next), status_code=303)
    cookie = web_auth.encode_session(
        rt.settings.secret_key,
        web_auth.WebSession(
            user_id=who.user_id, password_tag=who.password_tag, issued_at=time.time()
        ),
    )
    response.set_cookie(
        web_auth.SESSION_COOKIE,
        cookie,
        max_age=web_auth.SESSION_MAX_AGE_SECONDS,
        httponly=True,
        samesite="lax",
        secure=page.secure,
        path="/",
    )
    # A fresh CSRF nonce at login: a token seen by anyone before sign-in is now worthless.
    set_csrf_cookie(response, web_auth.new_csrf_nonce(), secure=page.secure)  # type: ignore[arg-type]
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response  # type: ignore[return-value]


@router.post("/logout", dependencies=[CsrfDep])
def logout(page: PageDep, session: DbDep) -> RedirectResponse:
    if page.user is not None:
        record_logout(session, name=page.user.name)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(
        web_auth.SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=page.secure
    )
    return response
