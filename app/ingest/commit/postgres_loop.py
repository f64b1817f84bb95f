"""PostgreSQL group commits awaited on the event loop, not run on a worker thread.

Why: a commit on a thread (``asyncio.to_thread``) makes four network round trips (begin, two
upserts, commit), and after each the thread must take the GIL back from an event loop busy
parsing requests, which CPython forces only every switch interval (5 ms). In
``benchmarks/ingest.py --postgres`` such a group commit took 4.1 ms mean and ingest ran at 0.40x
the baseline. Here the same statements and transaction (``write_ingest_group_in``) run through
SQLAlchemy's asyncio engine over psycopg's async connection: ``AsyncConnection.run_sync`` runs
the code in a greenlet on the loop thread and every network wait is an await, so the loop serves
other requests meanwhile and no thread waits for the GIL.

Used for ``postgresql+psycopg`` URLs unless ``ingest.postgres_commits_on_loop`` is false, and
never with the shared (Redis) window, whose commits also publish to Redis from the thread.
Failures are the same SQLAlchemy exceptions as on the thread path (``is_transient`` sorts them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.core.write_turns import WriteTurns
from app.ingest.commit.groups import QueuedBatch
from app.ingest.commit.thread import ThreadCommitter
from app.ingest.persist import IngestGroup, write_ingest_group_in
from app.ingest.phases import PhaseRetention

# The name the committer's connection shows in pg_stat_activity.
APPLICATION_NAME = "rlguard-ingest-commits"


def supports_loop_commits(url: str) -> bool:
    """Whether ``url``'s driver has an asyncio connection this committer can use."""
    parsed = make_url(url)
    return parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg"


class LoopPostgresCommitter:
    """Commits ingest groups on an asyncio connection of its own (one event loop); bisecting a
    refused group runs on ``thread``."""

    def __init__(self, url: str, thread: ThreadCommitter) -> None:
        if not supports_loop_commits(url):
            shown = make_url(url).render_as_string(hide_password=True)
            raise ValueError(f"loop commits need a postgresql+psycopg URL, not {shown!r}")
        # One connection, held: the group committer awaits each commit before the next, and a
        # checkout per commit would add a round trip (the pool's ping) to every one.
        self.engine = create_async_engine(
            url,
            pool_size=1,
            max_overflow=0,
            connect_args={"application_name": APPLICATION_NAME},
        )
        self.commits = 0
        self._conn: AsyncConnection | None = None
        self.thread = thread
        self.write_turns: WriteTurns | None = None  # PostgreSQL: no single write lock to share

    async def start(self) -> None:
        return None  # connected at the first commit

    async def commit(
        self,
        group: IngestGroup,
        batches: Sequence[QueuedBatch],
        phase_retention: PhaseRetention | None,
    ) -> str:
        """Write ``group`` in one transaction; raises what the thread path would."""
        conn = self._conn
        if conn is None:
            conn = self._conn = await self.engine.connect()
        try:
            async with conn.begin():
                await conn.run_sync(write_ingest_group_in, group, phase_retention=phase_retention)
        except BaseException:
            # Lost, broken or refused: never reused (the retry, or the isolation on a thread,
            # starts from a fresh connection; a disconnect is not always recognised as one).
            self._conn = None
            with contextlib.suppress(Exception):
                await conn.invalidate()
            raise
        self.commits += 1
        return "loop"

    def commit_on_this_thread(
        self, batches: Sequence[QueuedBatch], phase_retention: PhaseRetention | None
    ) -> None:
        self.thread.commit_on_this_thread(batches, phase_retention)

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a server already gone: nothing to close
                await conn.close()
        await self.engine.dispose()
