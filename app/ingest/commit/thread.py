"""Group commits on a worker thread (``asyncio.to_thread``): the path every committer keeps.

With the shared (Redis) window it is the only path: after the database, the group's samples
and heartbeats are published to the other replicas. On SQLite the commit takes its turn
against the background writers (:mod:`app.core.write_turns`): the policy tick's next write
waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import nullcontext

from sqlalchemy.engine import Engine

from app.core.write_turns import WriteTurns
from app.ingest.commit.groups import QueuedBatch, group_of
from app.ingest.persist import IngestGroup, write_ingest_group
from app.ingest.phases import PhaseRetention
from app.series.backend import ParticipantHeartbeat, Sample, SeriesBackend

PATH = "thread"


class ThreadCommitter:
    """Writes a group on the calling thread; ``commit`` runs that on a worker thread."""

    def __init__(self, engine: Engine, backend: SeriesBackend) -> None:
        self.engine = engine
        self.backend = backend
        # SQLite's one write lock is shared with the background writers; PostgreSQL has none.
        self.write_turns = WriteTurns() if engine.dialect.name == "sqlite" else None

    async def start(self) -> None:
        return None

    async def commit(
        self,
        group: IngestGroup,
        batches: Sequence[QueuedBatch],
        phase_retention: PhaseRetention | None,
    ) -> str:
        await asyncio.to_thread(self.write, group, batches, phase_retention)
        return PATH

    def commit_on_this_thread(
        self, batches: Sequence[QueuedBatch], phase_retention: PhaseRetention | None
    ) -> None:
        self.write(group_of(batches), batches, phase_retention)

    def write(
        self,
        group: IngestGroup,
        batches: Sequence[QueuedBatch],
        phase_retention: PhaseRetention | None,
    ) -> None:
        with self.write_turns.ingest_commit() if self.write_turns else nullcontext():
            write_ingest_group(self.engine, group, phase_retention=phase_retention)
        # After the database: a retry after a failed publish rewrites the same (idempotent)
        # upserts, and never appends the samples to the shared stream twice.
        samples: list[Sample] = []
        shared: list[ParticipantHeartbeat] = []
        if self.backend.shared:
            for b in batches:
                samples.extend(b.samples)
                shared.extend(b.shared)
        self.backend.publish(samples, shared, certain=any(b.certain for b in batches))

    async def stop(self) -> None:
        return None
