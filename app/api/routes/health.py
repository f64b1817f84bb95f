"""Liveness and readiness probes."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from app.core.db import ping

router = APIRouter(tags=["health"])
log = logging.getLogger("rlguard.health")


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    summary="The database answers and ingest can commit",
    responses={503: {"description": "not ready"}},
)
async def readyz(request: Request) -> JSONResponse:
    try:
        await run_in_threadpool(ping, request.app.state.engine)
    except (SQLAlchemyError, OSError) as exc:
        log.warning("readiness check failed: %s", type(exc).__name__)
        return JSONResponse(
            {"status": "unavailable", "database": f"unreachable ({type(exc).__name__})"},
            status_code=503,
        )
    if not request.app.state.ingest.committer_alive():
        return JSONResponse(
            {"status": "unavailable", "database": "ok", "ingest": "committer stopped"},
            status_code=503,
        )
    return JSONResponse({"status": "ok", "database": "ok"})
