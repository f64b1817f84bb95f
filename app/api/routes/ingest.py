"""``POST /api/v1/ingest``: node agents' batches (see ``app.ingest.pipeline`` for the guarantees)."""

from __future__ import annotations

import zlib

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api.deps import IngestDep, NodeAuth
from app.ingest.public import IngestAck
from app.ingest.validation import IngestRejected

router = APIRouter(prefix="/api/v1", tags=["ingest"])


async def read_capped_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise IngestRejected(
                f"Content-Length {declared!r} is not a number", status_code=400, kind="bad_json"
            ) from None
        if size > limit:
            refused = IngestRejected(
                f"body is {size} bytes, more than the limit of {limit}",
                status_code=413,
                kind="too_large",
            )
            refused.closes_connection = True  # none of it was read
            raise refused
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            refused = IngestRejected(
                f"body is more than the limit of {limit} bytes", status_code=413, kind="too_large"
            )
            refused.closes_connection = True  # the rest of it was not read
            raise refused
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding: gzip`` (bounded: a small body may not inflate past ``limit``)."""
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return body
    if encoding.strip().lower() != "gzip":
        raise IngestRejected(
            f"Content-Encoding {encoding!r} is not supported (use gzip or none)",
            status_code=415,
            kind="bad_json",
        )
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise IngestRejected(
            f"body is not valid gzip: {exc}", status_code=400, kind="bad_json"
        ) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise IngestRejected(
            f"decompressed body is more than the limit of {limit} bytes",
            status_code=413,
            kind="too_large",
        )
    if not inflater.eof:
        raise IngestRejected("body is a truncated gzip stream", status_code=400, kind="bad_json")
    return out


@router.post(
    "/ingest",
    response_model=IngestAck,
    summary="Ingest one batch of samples and participant heartbeats from a node agent",
    responses={
        400: {"description": "malformed JSON"},
        401: {"description": "no token, or an unknown or revoked token"},
        403: {
            "description": "a user token, a token of another node, or a job outside the "
            "token's job scope"
        },
        413: {"description": "body (also once decompressed) larger than the configured limit"},
        415: {"description": "a Content-Encoding other than gzip"},
        422: {"description": "a field is invalid or a limit is exceeded; nothing was applied"},
        429: {
            "description": "the node's new-series budget or its share of the ingest CPU time "
            "is spent (Retry-After); nothing was applied"
        },
        503: {"description": "applied in memory but not yet durable; retry the same seq"},
    },
)
async def ingest(request: Request, identity: NodeAuth, service: IngestDep) -> Response:
    limits = service.limits
    service.admit_request(identity.node)  # a node owing CPU time: 429, its body never read
    try:
        body = await read_capped_body(request, limits.max_body_bytes)
        body = decode_body(body, request.headers.get("content-encoding"), limits.max_body_bytes)
    except IngestRejected as exc:
        service.metrics.ingest_rejections.labels(reason=exc.kind).inc()
        raise
    result = await service.ingest(body, token_node=identity.node, authorize=identity.check_batch)
    return Response(
        orjson.dumps({"accepted": result.accepted, "duplicate": result.duplicate}),
        media_type="application/json",
    )
