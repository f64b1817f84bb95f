"""Each agent's dedupe state in the ingest service, and answering requests once their group
committed (split out of ``app.ingest.pipeline``, which holds the order of these steps)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.core.server_metrics import ServerMetrics
from app.ingest.certain import CertainFaultWatch
from app.ingest.commit.groups import QueuedBatch, Rejection
from app.ingest.dedupe import DedupeWindow
from app.ingest.validation import IngestRejected

# Refused seqs remembered per agent, for a retry that arrived while the original was queued.
REMEMBER_REJECTED = 64


@dataclass(slots=True)
class AgentState:
    window: DedupeWindow
    version: int = 0  # bumped on every mark
    durable_version: int = 0  # every batch up to this version is committed (or refused)
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)  # seq -> why the database refused it


def resolve_requests(
    agents: dict[tuple[str, str], AgentState],
    done_by_batch: dict[int, asyncio.Future[None]],
    committed: Sequence[QueuedBatch],
    rejected: Sequence[Rejection],
    *,
    metrics: ServerMetrics,
    certain: CertainFaultWatch | None,
) -> None:
    """Answer the requests of ``committed`` and ``rejected`` batches (together a prefix of
    the queue) and advance their agents' durable versions past them."""
    versions: dict[tuple[str, str], int] = {}
    for r in rejected:
        b = r.batch
        state = agents[(b.node, b.agent_id)]
        # Released: a retry is applied (and refused) again instead of answered "duplicate".
        state.window.unmark(b.seq)
        state.rejected[b.seq] = r.reason
        if len(state.rejected) > REMEMBER_REJECTED:
            del state.rejected[next(iter(state.rejected))]
        metrics.ingest_batches_rejected.labels(reason=r.field).inc()
        done = done_by_batch.pop(id(b))
        if not done.done():
            done.set_exception(IngestRejected(r.reason, kind="uncommittable"))
    any_certain = False
    for b in committed:
        any_certain = any_certain or b.certain
        done = done_by_batch.pop(id(b))
        if not done.done():
            done.set_result(None)
    if any_certain and certain is not None:
        # After the commit, never before: the early tick must find the batch durable (the
        # node's last-seen it reads is in the database). Setting an event: no delay here.
        certain.durable()
    for b in [*committed, *(r.batch for r in rejected)]:
        key = (b.node, b.agent_id)
        versions[key] = max(versions.get(key, 0), b.version)
    for k, version in versions.items():
        state = agents[k]
        if version > state.durable_version:
            state.durable_version = version
        still = []
        for want, fut in state.waiters:
            if want <= state.durable_version:
                if not fut.done():
                    fut.set_result(None)
            else:
                still.append((want, fut))
        state.waiters = still
