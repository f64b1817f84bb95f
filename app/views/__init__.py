"""Dashboard pages and htmx partials (HTML; not part of the OpenAPI schema)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from sqlmodel import Session
from starlette.concurrency import run_in_threadpool

from app.views import (
    admin,
    alerts,
    approvals,
    auth,
    drills,
    fleet,
    guardrails,
    incidents,
    jobs,
    nodes,
    overview,
    runbooks,
    silences,
)
from app.views.context import PageContext, page_context, runtime
from app.views.rendering import STATIC_DIR, error_page

_MODULES = (
    auth,
    overview,
    fleet,
    nodes,
    jobs,
    incidents,
    approvals,
    alerts,
    silences,
    drills,
    guardrails,
    admin,
    runbooks,
)
router = APIRouter(include_in_schema=False)
for _module in _MODULES:
    router.include_router(_module.router)
_PAGE_PATHS = frozenset(getattr(r, "path", "") for m in _MODULES for r in m.router.routes)


def mount_dashboard(app: FastAPI) -> None:
    """Add the pages, their partials and ``/static`` to ``app``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_exception_handler(RequestValidationError, _bad_page_parameter)  # type: ignore[arg-type]


async def _bad_page_parameter(request: Request, exc: RequestValidationError) -> Response:
    """A page parameter the route's types refuse (an id beyond 64 bits, a word for a number):
    the error page naming it, as the pages' own checks answer; the API keeps FastAPI's JSON."""
    route = request.scope.get("route")
    if getattr(route, "path", None) not in _PAGE_PATHS:
        return await request_validation_exception_handler(request, exc)
    reason = "; ".join(
        f"{err['loc'][-1]}: {err['msg']} (got {str(err.get('input'))[:40]!r})"
        for err in exc.errors()[:3]
    )

    def context() -> PageContext:
        with Session(request.app.state.engine, expire_on_commit=False) as session:
            return page_context(request, runtime(request), session)

    page = await run_in_threadpool(context)
    return error_page(request, page, "Bad request", reason, status_code=422)
