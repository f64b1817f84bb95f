"""Baseline endpoint for ``benchmarks/ingest.py``: only ``orjson.loads`` and ``list.extend``.

Mounted only when ``RLGUARD_BENCH_ENDPOINTS=1``; never part of a production server.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

router = APIRouter(prefix="/bench", include_in_schema=False)

_sink: list[Any] = []


@router.post("/baseline-ingest")
async def baseline_ingest(request: Request) -> Response:
    data = orjson.loads(await request.body())
    samples = data["samples"]
    _sink.extend(samples)
    if len(_sink) > 1_000_000:
        _sink.clear()
    return Response(
        orjson.dumps({"accepted": len(samples), "duplicate": False}), media_type="application/json"
    )


@router.post("/forget-baseline")
async def forget_baseline() -> Response:
    """Drop what the baseline endpoint kept: called after each baseline round, so that the
    next endpoint's rounds do not run with up to 1,000,000 of its parsed dicts in the heap
    (every full garbage-collector pass walked them: 100-230 ms each, during ingest rounds)."""
    _sink.clear()
    return Response(status_code=204)
