"""Liveness and readiness probes (what readiness checks: app.core.readiness)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database answers, ingest can commit and (cluster mode) the broker answers",
    responses={503: {"description": "not ready: the failing part is named"}},
)
async def readyz(request: Request) -> JSONResponse:
    readiness = await request.app.state.readiness.check()
    return JSONResponse(readiness.body(), status_code=200 if readiness.ready else 503)
