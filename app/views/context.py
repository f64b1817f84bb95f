"""Per-request state of a dashboard page: who is signed in, their CSRF token, the runtime.

The server keeps its long-lived objects on ``app.state`` (settings, database engine, series
store); views reach them only through :func:`runtime` so that this is the single place that knows
where they live.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.api.deps import SessionDep
from app.core.config import Settings
from app.models import Role, User
from app.services import web_auth
from app.services.dashboard.incidents import pending_approvals_count
from app.services.series_store import SeriesStore

log = logging.getLogger("rlguard.views")


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    engine: Engine
    store: SeriesStore


def runtime(request: Request) -> Runtime:
    state = request.app.state
    return Runtime(settings=state.settings, engine=state.engine, store=state.series_store)


def running_policy(request: Request) -> Any | None:
    """The policy the server's scheduler loaded (app.services.scheduler), if it runs."""
    return getattr(getattr(request.app.state, "policy_scheduler", None), "policy", None)


RuntimeDep = Annotated[Runtime, Depends(runtime)]
DbDep = SessionDep  # the same per-request session the REST routes use


@dataclass(frozen=True, slots=True)
class SignedInUser:
    id: int
    name: str
    role: Role

    @property
    def can_decide(self) -> bool:
        return self.role.allows(Role.approver)


@dataclass(slots=True)
class PageContext:
    user: SignedInUser | None
    csrf_nonce: str
    new_csrf_nonce: str | None  # set when this response must give the browser its nonce
    csrf_token: str
    secure: bool
    now: float
    pending_approvals: int = 0

    @property
    def can_decide(self) -> bool:
        return self.user is not None and self.user.can_decide


def request_is_https(request: Request) -> bool:
    """HTTPS directly, or a reverse proxy in front says the browser used HTTPS."""
    if request.url.scheme == "https":
        return True
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return forwarded == "https"


def _signed_in_user(request: Request, session: Session, secret: str) -> SignedInUser | None:
    raw = request.cookies.get(web_auth.SESSION_COOKIE)
    if not raw:
        return None
    try:
        web_session = web_auth.decode_session(secret, raw)
    except web_auth.SessionError as exc:
        log.info("dashboard session refused: %s", exc)
        return None
    user = session.get(User, web_session.user_id)
    if user is None or user.disabled or user.id is None:
        return None
    if web_auth.password_tag(user.password_hash) != web_session.password_tag:
        return None  # the password changed since this session was issued
    return SignedInUser(id=user.id, name=user.name, role=Role(user.role))


def page_context(request: Request, rt: RuntimeDep, session: DbDep) -> PageContext:
    """The context of any page, signed in or not."""
    secret = rt.settings.secret_key
    nonce = request.cookies.get(web_auth.CSRF_COOKIE)
    new_nonce = None
    if not nonce or len(nonce) > 64:
        nonce = new_nonce = web_auth.new_csrf_nonce()
    return PageContext(
        user=_signed_in_user(request, session, secret),
        csrf_nonce=nonce,
        new_csrf_nonce=new_nonce,
        csrf_token=web_auth.csrf_token(secret, nonce),
        secure=request_is_https(request),
        now=time.time(),
    )


def signed_in_page(
    request: Request, page: Annotated[PageContext, Depends(page_context)], session: DbDep
) -> PageContext:
    """The context of a page that needs a signed-in user; others are sent to the login form."""
    if page.user is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        login = f"/login?next={quote(target, safe='')}"
        if request.headers.get("HX-Request") == "true":
            # htmx follows HX-Redirect with a full page load instead of swapping a login form
            # into the middle of the page.
            raise HTTPException(
                status_code=401, detail="sign in first", headers={"HX-Redirect": login}
            )
        raise HTTPException(status_code=303, detail="sign in first", headers={"Location": login})
    page.pending_approvals = pending_approvals_count(session)
    return page


async def _submitted_csrf_token(request: Request) -> str | None:
    token = request.headers.get(web_auth.CSRF_HEADER)
    if token:
        return token
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        value = form.get(web_auth.CSRF_FORM_FIELD)
        return value if isinstance(value, str) else None
    return None


async def require_csrf(request: Request) -> None:
    """Refuses a state-changing request whose CSRF token does not match the browser's cookie."""
    secret = request.app.state.settings.secret_key
    nonce = request.cookies.get(web_auth.CSRF_COOKIE)
    token = await _submitted_csrf_token(request)
    if not web_auth.csrf_token_valid(secret, nonce, token):
        reason = "CSRF token missing" if not token else "CSRF token invalid"
        log.warning(
            "dashboard request refused: %s (%s %s)", reason, request.method, request.url.path
        )
        raise HTTPException(status_code=403, detail=reason, headers={"X-RLGuard-Reason": reason})


PageDep = Annotated[PageContext, Depends(page_context)]
SignedInDep = Annotated[PageContext, Depends(signed_in_page)]
CsrfDep = Depends(require_csrf)
