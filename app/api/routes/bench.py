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
