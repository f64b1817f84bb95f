"""Per-request state of a dashboard page: who is signed in, their CSRF token, the runtime.

The server keeps its long-lived objects on ``app.state`` (settings, database engine, series
store, loaded policy, the overview's caches); views reach them only through :func:`runtime` so that this is the single place that knows
where they live.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Annotated, TypedDict
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.api.deps import SessionDep
from app.auth import sessions
from app.auth import web as web_auth
from app.auth.audit import AUDIT_READER_ROLE
from app.core.config import Settings
from app.ingest.quotas import NodeQuotas
from app.models import Role
from app.policy.policy_file import Policy
from app.series.store import SeriesStore
from app.views.models.incidents import pending_approvals_count
from app.views.models.overview import DashboardCaches

log = logging.getLogger("rlguard.views")


class Liveness(TypedDict):
    """What a view model judges a heartbeat's age with: the page's time and the running
    policy's limits (``job_detail(..., **rt.liveness(page.now))``)."""

    now: float
    suspect_after: float
    confirm_after: float


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    engine: Engine
    store: SeriesStore
    # The policy the engine runs (app.runtime.load_running_policy), scheduler or not.
    policy: Policy
    caches: DashboardCaches
    # Per-node ingest quotas and their use (the node page; app.ingest.quotas).
    quotas: NodeQuotas

    @property
    def suspect_after(self) -> float:
        return self.policy.detection.heartbeat.suspect_seconds

    @property
    def confirm_after(self) -> float:
        return self.policy.detection.heartbeat.confirm_seconds

    def liveness(self, now: float) -> Liveness:
        return Liveness(now=now, suspect_after=self.suspect_after, confirm_after=self.confirm_after)


def runtime(request: Request) -> Runtime:
    state = request.app.state
    return Runtime(
        settings=state.settings,
        engine=state.engine,
        store=state.series_store,
        policy=state.policy,
        caches=state.dashboard_caches,
        quotas=state.node_quotas,
    )


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

    @property
    def can_read_audit(self) -> bool:
        return self.role.allows(AUDIT_READER_ROLE)

    @property
    def can_silence(self) -> bool:
        # As the REST API: operators and above create and expire silences, viewers list them.
        return self.role.allows(Role.operator)


@dataclass(slots=True)
class PageContext:
    user: SignedInUser | None
    session_id: str | None  # the cookie value of the live session, when signed in
    new_csrf_nonce: str | None  # set when this response must give the browser its nonce
    csrf_token: str
    secure: bool
    now: float
    pending_approvals: int = 0

    @property
    def can_decide(self) -> bool:
        return self.user is not None and self.user.can_decide


def request_is_https(request: Request) -> bool:
    """Whether the browser used HTTPS. ``X-Forwarded-Proto`` counts only from a configured
    proxy: the trusted-proxy middleware (app.core.forwarded) has already set the scheme."""
    return request.url.scheme == "https"


def session_cookie(request: Request) -> str | None:
    """The session cookie's value, under the name this request's scheme uses."""
    return request.cookies.get(web_auth.session_cookie_name(request_is_https(request)))


def csrf_binding(request: Request) -> str | None:
    """What this browser's CSRF token is bound to: its session once signed in, else its nonce.

    Pages and :func:`require_csrf` both use this, so a token is accepted exactly when it was
    made for the session (or pre-login nonce) the request carries.
    """
    secure = request_is_https(request)
    session_id = session_cookie(request)
    if session_id and len(session_id) <= sessions.MAX_SESSION_ID_LENGTH:
        return web_auth.session_binding(session_id)
    nonce = request.cookies.get(web_auth.csrf_cookie_name(secure))
    if nonce and len(nonce) <= web_auth.MAX_NONCE_LENGTH:
        return web_auth.nonce_binding(nonce)
    return None


def _signed_in(session: Session, session_id: str | None) -> tuple[SignedInUser | None, str | None]:
    active = sessions.resolve_session(session, session_id)
    if active is None or active.user.id is None:
        return None, None
    user, user_id = active.user, active.user.id
    # The role is read from the database on every request, never kept in the cookie.
    return SignedInUser(id=user_id, name=user.name, role=Role(user.role)), session_id


def page_context(request: Request, rt: RuntimeDep, session: DbDep) -> PageContext:
    """The context of any page, signed in or not."""
    secret = rt.settings.secret_key
    binding = csrf_binding(request)
    new_nonce = None
    if binding is None:
        new_nonce = web_auth.new_csrf_nonce()
        binding = web_auth.nonce_binding(new_nonce)
    user, session_id = _signed_in(session, session_cookie(request))
    return PageContext(
        user=user,
        session_id=session_id,
        new_csrf_nonce=new_nonce,
        csrf_token=web_auth.csrf_token(secret, binding),
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
    """Refuses a state-changing request whose CSRF token was not made for this browser's
    session (or, before sign-in, its nonce cookie)."""
    secret = request.app.state.settings.secret_key
    token = await _submitted_csrf_token(request)
    if not web_auth.csrf_token_valid(secret, csrf_binding(request), token):
        reason = "CSRF token missing" if not token else "CSRF token invalid"
        log.warning(
            "dashboard request refused: %s (%s %s)", reason, request.method, request.url.path
        )
        raise HTTPException(status_code=403, detail=reason, headers={"X-RLGuard-Reason": reason})


PageDep = Annotated[PageContext, Depends(page_context)]
SignedInDep = Annotated[PageContext, Depends(signed_in_page)]
CsrfDep = Depends(require_csrf)
