"""Runbooks: ``/runbooks`` (the list) and ``/runbooks/{name}`` (one, rendered from
``docs/runbooks/<name>.md``). Linked from every incident and approval page, from every alert
message, from ``/api/v2/alerts`` and from each Prometheus rule's ``runbook_url``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.views.context import SignedInDep
from app.views.models.runbooks import load_runbook, runbook_names
from app.views.rendering import error_page, render

router = APIRouter(include_in_schema=False)


@router.get("/runbooks", response_class=HTMLResponse)
def runbooks_page(request: Request, page: SignedInDep) -> HTMLResponse:
    return render(request, page, "pages/runbooks.html", {"names": runbook_names()})


@router.get("/runbooks/{name}", response_class=HTMLResponse)
def runbook_page(request: Request, page: SignedInDep, name: str) -> HTMLResponse:
    runbook = load_runbook(name)
    if runbook is None:
        shown = name[:64]
        return error_page(
            request, page, "No such runbook", f"there is no runbook {shown!r}", status_code=404
        )
    return render(request, page, "pages/runbook.html", {"runbook": runbook})
