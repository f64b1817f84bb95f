"""Approvals: the queue (polling), one approval (the page alert links open), approve/reject."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import RowId
from app.core.errors import NotFound, ServiceError
from app.views.context import CsrfDep, DbDep, PageContext, SignedInDep
from app.views.models.approvals import approval_card, approval_queue, decide
from app.views.rendering import error_page, is_htmx, render

router = APIRouter(include_in_schema=False)

POLL_SECONDS = 5


def _queue(session: Any, page: PageContext) -> dict[str, Any]:
    pending, decided = approval_queue(session, now=page.now)
    return {
        "pending": pending,
        "decided": decided,
        "poll_seconds": POLL_SECONDS,
        "active_nav": "approvals",
    }


@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    return render(request, page, "pages/approvals.html", _queue(session, page))


@router.get("/ui/approvals/queue", response_class=HTMLResponse)
def approvals_queue_partial(request: Request, page: SignedInDep, session: DbDep) -> HTMLResponse:
    return render(request, page, "partials/_approvals_queue.html", _queue(session, page))


@router.get("/approvals/{approval_id}", response_class=HTMLResponse)
def approval_page(
    approval_id: RowId, request: Request, page: SignedInDep, session: DbDep
) -> HTMLResponse:
    try:
        card = approval_card(session, approval_id=approval_id, now=page.now)
    except NotFound as exc:
        return error_page(request, page, "Unknown approval", str(exc), status_code=404)
    return render(request, page, "pages/approval.html", {"card": card, "active_nav": "approvals"})


def _decide(
    approval_id: RowId,
    request: Request,
    page: PageContext,
    session: Any,
    *,
    approve: bool,
    comment: str,
) -> Response:
    assert page.user is not None  # SignedInDep guarantees it
    if not page.user.can_decide:
        # The button is not even shown to this role; a hand-made request gets a clear refusal.
        message = (
            f"deciding an approval needs the approver role; {page.user.name} is {page.user.role}"
        )
        return error_page(request, page, "Not allowed", message, status_code=403)
    try:
        decide(
            session, approval_id=approval_id, user_id=page.user.id, approve=approve, comment=comment
        )
    except ServiceError as exc:
        session.rollback()
        return error_page(request, page, "Not done", str(exc), status_code=exc.status_code)
    if not is_htmx(request):
        return RedirectResponse(f"/approvals/{approval_id}", status_code=303)
    card = approval_card(session, approval_id=approval_id, now=page.now)
    return render(
        request,
        page,
        "partials/_approval_card.html",
        {"card": card},
        headers={"HX-Trigger": "approval-decided"},
    )


@router.post("/approvals/{approval_id}/approve", dependencies=[CsrfDep])
def approve(
    approval_id: RowId,
    request: Request,
    page: SignedInDep,
    session: DbDep,
    comment: Annotated[str, Form()] = "",
) -> Response:
    return _decide(approval_id, request, page, session, approve=True, comment=comment)


@router.post("/approvals/{approval_id}/reject", dependencies=[CsrfDep])
def reject(
    approval_id: RowId,
    request: Request,
    page: SignedInDep,
    session: DbDep,
    comment: Annotated[str, Form()] = "",
) -> Response:
    return _decide(approval_id, request, page, session, approve=False, comment=comment)
