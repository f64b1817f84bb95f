"""Dashboard pages and htmx partials (HTML; not part of the OpenAPI schema)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.staticfiles import StaticFiles

from app.views import admin, alerts, approvals, auth, incidents, jobs, nodes, overview
from app.views.rendering import STATIC_DIR

router = APIRouter(include_in_schema=False)
for _module in (auth, overview, nodes, jobs, incidents, approvals, alerts, admin):
    router.include_router(_module.router)


def mount_dashboard(app: FastAPI) -> None:
    """Add the pages, their partials and ``/static`` to ``app``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
