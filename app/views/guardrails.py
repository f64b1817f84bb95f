"""Guard-rails on the dashboard: the Overview's breakers panel with its Reset button (approvers)
and a job's automation toggles (dry run: operators; hands off: approvers). The role checks and
the audit rows are app.guardrails' (as the REST API's); a refusal shows its reason."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session

from app.core.errors import NotFound
from app.guardrails import automation
from app.incidents import breaker_reset
from app.models import User
from app.views.context import CsrfDep, DbDep, PageContext, SignedInDep
from app.views.models.guardrails import breaker_panel, job_switches
from app.views.rendering import after_change, commit_or_refusal, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 10


def breakers_data(session: Session, page: PageContext) -> dict[str, Any]:
    assert page.user is not None  # SignedInDep guarantees it
    return {"breakers": breaker_panel(session, role=page.user.role), "breakers_poll": POLL_SECONDS}


def switches_data(session: Session, page: PageContext, job: str) -> dict[str, Any]:
    """The job's switches for its page; NotFound for an unknown job."""
    assert page.user is not None
    return {"switches": job_switches(session, job=job, role=page.user.role)}


def _user(session: Session, page: PageContext) -> User:
    assert page.user is not None
    user = session.get(User, page.user.id)
    if user is None:  # deleted since the page context was read
        raise NotFound("your user no longer exists")
    return user


@router.get("/ui/overview/breakers", response_class=HTMLResponse)
def breakers_partial(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    return render(request, page, "partials/_overview_breakers.html", breakers_data(session, page))


@router.post("/breakers/{scope}/reset", dependencies=[CsrfDep])
def reset_breaker(
    scope: str,
    request: Request,
    page: SignedInDep,
    session: DbDep,
    comment: Annotated[str, Form(max_length=500)] = "",
) -> Response:
    def reset() -> None:
        user = _user(session, page)
        breaker_reset.reset_breaker_as(session, scope=scope, user=user, comment=comment)

    refused = commit_or_refusal(request, page, session, "Not reset", reset)
    return refused or after_change(
        request, page, "/", "partials/_overview_breakers.html", lambda: breakers_data(session, page)
    )


@router.post("/jobs/{name}/automation", dependencies=[CsrfDep])
def set_automation(
    name: str,
    request: Request,
    page: SignedInDep,
    session: DbDep,
    dry_run: Annotated[bool | None, Form()] = None,
    hands_off: Annotated[bool | None, Form()] = None,
    reason: Annotated[str, Form(max_length=500)] = "",
) -> Response:
    def switch() -> None:
        user = _user(session, page)
        automation.set_job_automation(
            session, job=name, user=user, dry_run=dry_run, hands_off=hands_off, reason=reason
        )

    refused = commit_or_refusal(request, page, session, "Not changed", switch)
    job_page = f"/jobs/{quote(name, safe='')}"
    return refused or after_change(
        request,
        page,
        job_page,
        "partials/_job_automation.html",
        lambda: switches_data(session, page, name),
    )
