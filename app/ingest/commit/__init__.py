"""How an ingest group reaches the database: one :class:`Committer` per server process.

The pipeline (:mod:`app.ingest.pipeline`) merges the batches it accepted into one group
(:mod:`app.ingest.commit.groups`) and hands it to its committer, which writes it in one
transaction and says which path it took (the ``path`` label of ``rlguard_ingest_commits_total``):

- ``thread`` (:mod:`app.ingest.commit.thread`): on a worker thread; the only path with the
  shared (Redis) window, whose commits also publish there. Every committer keeps one, for its
  fallbacks and for bisecting a group the database refused;
- ``inline`` (:mod:`app.ingest.commit.sqlite_loop`): SQLite, on the event loop when that is safe
  and fast, the WAL's fsync on a native thread (:mod:`app.ingest.commit.loop_fsync`); the thread
  path when the write lock is taken or commits got slow;
- ``loop`` (:mod:`app.ingest.commit.postgres_loop`): PostgreSQL, awaited on the event loop
  through an asyncio psycopg connection.

:func:`choose_committer` picks one from the settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sqlalchemy.engine import Engine

from app.core.config import Settings
from app.core.db import is_sqlite
from app.core.write_turns import WriteTurns
from app.ingest.commit.groups import QueuedBatch
from app.ingest.persist import IngestGroup
from app.ingest.phases import PhaseRetention
from app.series.backend import SeriesBackend


class Committer(Protocol):
    """Writes ingest groups, each in one transaction."""

    # SQLite's turns between the thread path's commits and the background writers (the tick's
    # incident writes, the rollup pass): app.core.write_turns. None on PostgreSQL.
    write_turns: WriteTurns | None

    async def start(self) -> None:
        """Open what the first commit needs (off the hot path)."""

    async def commit(
        self,
        group: IngestGroup,
        batches: Sequence[QueuedBatch],
        phase_retention: PhaseRetention | None,
    ) -> str:
        """Write ``group`` (merged from ``batches``) durably; the path taken. Raises what the
        database raised (:func:`app.ingest.commit.groups.is_transient` sorts it)."""
        ...

    def commit_on_this_thread(
        self, batches: Sequence[QueuedBatch], phase_retention: PhaseRetention | None
    ) -> None:
        """Write ``batches`` as one group on the calling worker thread: what bisecting a group
        the database refused uses (:func:`app.ingest.commit.groups.isolate`)."""

    async def stop(self) -> None:
        """Release the committer's connections (after the last commit)."""


def choose_committer(settings: Settings, engine: Engine, backend: SeriesBackend) -> Committer:
    """The committer the settings ask for: ``inline`` on SQLite (unless
    ``ingest.inline_commit_max_ms`` is 0), ``loop`` on ``postgresql+psycopg`` (unless
    ``ingest.postgres_commits_on_loop`` is false), ``thread`` otherwise and always with the
    shared window."""
    from app.ingest.commit.postgres_loop import LoopPostgresCommitter, supports_loop_commits
    from app.ingest.commit.sqlite_loop import InlineSqliteCommitter, SqliteLoopCommitter
    from app.ingest.commit.thread import ThreadCommitter

    thread = ThreadCommitter(engine, backend)
    if backend.shared:  # its commits also publish to Redis, from the thread
        return thread
    if is_sqlite(settings.db_url) and settings.ingest.inline_commit_max_ms > 0:
        inline = InlineSqliteCommitter(
            settings.db_url,
            sqlite_synchronous=settings.sqlite_synchronous,
            max_ms=settings.ingest.inline_commit_max_ms,
        )
        return SqliteLoopCommitter(inline, thread)
    if settings.ingest.postgres_commits_on_loop and supports_loop_commits(settings.db_url):
        return LoopPostgresCommitter(settings.db_url, thread)
    return thread
