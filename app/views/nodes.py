"""Node page: per-GPU charts, XID/ECC history, fingerprint."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.core.errors import NotFound
from app.views.context import DbDep, Runtime, RuntimeDep, SignedInDep
from app.views.models.node_quotas import quota_rows
from app.views.models.nodes import HISTORY_MINUTES, node_detail
from app.views.rendering import error_page, render

router = APIRouter(include_in_schema=False)

QUOTA_POLL_SECONDS = 10


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
        {
            "node": node,
            "history_minutes": HISTORY_MINUTES,
            "active_nav": "overview",
            **_quotas(rt, name),
        },
    )


@router.get("/ui/nodes/{name}/quotas", response_class=HTMLResponse)
def node_quotas_partial(
    name: str, request: Request, page: SignedInDep, rt: RuntimeDep
) -> HTMLResponse:
    return render(request, page, "partials/_node_quotas.html", _quotas(rt, name))


def _quotas(rt: Runtime, name: str) -> dict[str, object]:
    return {
        "quotas": quota_rows(rt.quotas, name),
        "node_name": name,
        "poll_seconds": QUOTA_POLL_SECONDS,
    }
