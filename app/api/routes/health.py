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
    ingest = request.app.state.ingest
    if not ingest.committer_alive():
        return JSONResponse(
            {"status": "unavailable", "database": "ok", "ingest": "committer stopped"},
            status_code=503,
        )
    # The ping can pass while the group commit keeps failing (a failure only the ingest writes
    # hit): acknowledged ingest is stalled then, so this replica is not ready.
    failing = ingest.commits_failing_for()
    if failing is not None:
        return JSONResponse(
            {
                "status": "unavailable",
                "database": "ok",
                "ingest": f"group commits failing for {failing:.1f} s",
            },
            status_code=503,
        )
    return JSONResponse({"status": "ok", "database": "ok"})
