"""Silences: the list (active, pending, expired), a create form and expire buttons (operators
and above; a viewer sees the list only). The checks are the REST API's (app.silences.store)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import RowId
from app.silences import store
from app.silences.public import SilenceCreate
from app.silences.text import matchers_from_text, parse_duration_minutes
from app.views.context import CsrfDep, DbDep, PageContext, RuntimeDep, SignedInDep
from app.views.models.silences import silence_rows, window_rows
from app.views.rendering import after_change, commit_or_refusal, error_page, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 10


def _now(page: PageContext) -> datetime:
    return datetime.fromtimestamp(page.now, UTC)


def _list(session: Any, page: PageContext) -> dict[str, Any]:
    return {
        "silences": silence_rows(session, now=_now(page)),
        "poll_seconds": POLL_SECONDS,
        "active_nav": "silences",
    }


def _refused(request: Request, page: PageContext) -> Response | None:
    assert page.user is not None  # SignedInDep guarantees it
    if page.user.can_silence:
        return None
    # The form is not even shown to this role; a hand-made request gets a clear refusal.
    message = f"silencing needs the operator role; {page.user.name} is {page.user.role}"
    return error_page(request, page, "Not allowed", message, status_code=403)


@router.get("/silences", response_class=HTMLResponse)
def silences_page(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    windows = {"windows": window_rows(session, now=_now(page))}
    return render(request, page, "pages/silences.html", _list(session, page) | windows)


@router.get("/ui/silences/list", response_class=HTMLResponse)
def silences_list_partial(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    return render(request, page, "partials/_silences_table.html", _list(session, page))


@router.post("/silences", dependencies=[CsrfDep])
def create_silence(
    request: Request,
    page: SignedInDep,
    session: DbDep,
    rt: RuntimeDep,
    matchers: Annotated[str, Form()] = "",
    duration: Annotated[str, Form()] = "2h",
    comment: Annotated[str, Form(max_length=500)] = "",
    stops_actions: Annotated[bool, Form()] = False,
) -> Response:
    refused = _refused(request, page)
    if refused is not None:
        return refused
    assert page.user is not None
    author = f"user:{page.user.name}"

    def create() -> None:
        body = SilenceCreate(
            matchers=matchers_from_text(re.split(r"[,\n]", matchers)),
            duration_minutes=parse_duration_minutes(duration),
            comment=comment,
            stops_actions=stops_actions,
        )
        store.create_silence(
            session,
            body,
            author=author,
            max_hours=rt.settings.silences.max_duration_hours,
            now=_now(page),
            max_regex_chars=rt.settings.silences.max_regex_chars,
        )

    refused = commit_or_refusal(request, page, session, "Not silenced", create)
    return refused or RedirectResponse("/silences", status_code=303)


@router.post("/silences/{silence_id}/expire", dependencies=[CsrfDep])
def expire_silence(
    silence_id: RowId, request: Request, page: SignedInDep, session: DbDep
) -> Response:
    refused = _refused(request, page)
    if refused is not None:
        return refused
    assert page.user is not None
    actor = f"user:{page.user.name}"
    refused = commit_or_refusal(
        request,
        page,
        session,
        "Not expired",
        lambda: store.expire_silence(session, silence_id, actor=actor, now=_now(page)),
    )
    return refused or after_change(
        request, page, "/silences", "partials/_silences_table.html", lambda: _list(session, page)
    )
