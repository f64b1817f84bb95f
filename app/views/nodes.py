"""Node page: per-GPU charts, XID/ECC history, fingerprint."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.core.errors import NotFound
from app.views.context import DbDep, RuntimeDep, SignedInDep
from app.views.models.nodes import HISTORY_MINUTES, node_detail
from app.views.rendering import error_page, render

router = APIRouter(include_in_schema=False)


@router.get("/nodes/{name}", response_class=HTMLResponse)
def node_page(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep, session: DbDep
) -> HTMLResponse:
    try:
        node = node_detail(session=session, store=rt.store, name=name, **rt.liveness(page.now))
    except NotFound as exc:
        return error_page(request, page, "Unknown node", str(exc), status_code=404)
    return render(
        request,
        page,
        "pages/node.html",
        {"node": node, "history_minutes": HISTORY_MINUTES, "active_nav": "overview"},
    )
