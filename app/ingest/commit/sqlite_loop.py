"""Group commits on the event loop thread, for SQLite, when that is safe and fast.

On a worker thread a commit waits for the GIL after every SQLite call that released it, which a
busy loop gives up only every switch interval; on the loop it pays no hand-off. A group goes to
the thread path instead when the write lock is taken by someone else (this connection's busy
timeout is 0: the attempt fails at once and rolls back), when inline commits got slow (the
moving average of their waiting, wall time less the thread's CPU time, above ``max_ms``: the
thread path for ``cooldown_s``), and always for PostgreSQL and a shared (Redis) window.

With ``synchronous=FULL`` (the default) the fsync stays off the loop: the inline connection
commits with ``NORMAL`` and the committer fsyncs the WAL file (``make_durable``: on a native
thread of ``app.ingest.commit.loop_fsync``, else a Python thread) before it answers any request
of the group, so an acknowledged batch is exactly as durable as with FULL. A group whose fsync
fails is retried whole; readers may see a group a few milliseconds before it is durable.
Checkpoints stay off the loop too: none inline, a passive one on a thread of its own every
``CHECKPOINT_EVERY_COMMITS`` inline commits (``maybe_checkpoint``). The measurements and the
durability argument: ``docs/performance.md``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from app.core.db import is_sqlite, make_engine
from app.ingest.commit.groups import QueuedBatch
from app.ingest.commit.loop_fsync import LoopFsync, native_fsync_available
from app.ingest.commit.thread import ThreadCommitter
from app.ingest.persist import IngestGroup, write_ingest_group
from app.ingest.phases import PhaseRetention

log = logging.getLogger("rlguard.ingest")


# Inline commits between two background checkpoints. A group writes a few pages (cursor and
# node rows), so this is about SQLite's own automatic interval of 1000 pages.
CHECKPOINT_EVERY_COMMITS = 250

# Weight of the newest commit in the moving average: a single commit more than 5x over the
# limit trips it, five in a row 1.5x over do too, one 2x blip among fast commits does not.
_WEIGHT = 0.2


def fsync_path(path: str) -> None:
    """fsync one file by name (opened and closed here: the WAL file may be recreated)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_automatic_checkpoints(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")


def _is_lock_conflict(exc: OperationalError) -> bool:
    text = str(exc.orig).lower()
    return "database is locked" in text or "database is busy" in text


class InlineSqliteCommitter:
    """Tries a group commit on the calling thread; says False when the thread path must do it."""

    def __init__(
        self,
        url: str,
        *,
        sqlite_synchronous: str,
        max_ms: float,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
        cpu_timer: Callable[[], float] = time.thread_time,
        fsync: Callable[[str], None] = fsync_path,
    ) -> None:
        if not is_sqlite(url):
            raise ValueError("inline commits are for SQLite only")
        # FULL: the commit does not fsync, sync_wal does (on a thread; see the module docstring).
        db_path = make_url(url).database or ""
        self.syncs_wal = sqlite_synchronous.upper() == "FULL" and db_path not in ("", ":memory:")
        self._db_path = db_path
        self.fsync = fsync  # the disk boundary (injectable for tests)
        # The real fsync runs natively where the module is built (see make_durable); made at the
        # first fsync, so that a server never started holds no socket for it.
        self._loop_fsync: LoopFsync | None = None
        self.native_syncs = 0
        # One connection, used only from the event loop thread.
        self.engine: Engine = make_engine(
            url,
            sqlite_synchronous="NORMAL" if self.syncs_wal else sqlite_synchronous,
            sqlite_busy_timeout_ms=0,
            pool_size=1,
            max_overflow=0,
        )
        sa.event.listen(self.engine, "connect", _no_automatic_checkpoints)
        # The background checkpoints' connection (a thread's; see the module docstring).
        self._checkpoint_engine: Engine = make_engine(url, pool_size=1, max_overflow=0)
        self._checkpointing: asyncio.Task[None] | None = None
        self._commits_since_checkpoint = 0
        self.checkpoints = 0
        self.max_s = max_ms / 1000.0
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._timer = timer  # measures commits (injectable for tests) ...
        self._cpu_timer = cpu_timer  # ... less the CPU they used (see the module docstring)
        self._paused_until = 0.0
        self._avg_s = 0.0  # exponentially weighted mean of inline commit times
        self.inline_commits = 0
        self.fallbacks = 0

    def connect(self) -> None:
        """Open the connection ahead of the first commit (call it off the event loop)."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def try_commit(self, group: IngestGroup, phase_retention: PhaseRetention | None) -> bool:
        """True: ``group`` is committed. False: nothing was written; commit it on the thread.

        Any other database error propagates (the caller retries the group as for a failed
        threaded commit)."""
        if self._clock() < self._paused_until:
            return False
        started, cpu_started = self._timer(), self._cpu_timer()
        try:
            write_ingest_group(self.engine, group, phase_retention=phase_retention)
        except OperationalError as exc:
            if not _is_lock_conflict(exc):
                raise
            self.fallbacks += 1
            return False  # rolled back by write_ingest_group's transaction
        elapsed = self._timer() - started
        waited = max(0.0, elapsed - (self._cpu_timer() - cpu_started))
        self.inline_commits += 1
        self._commits_since_checkpoint += 1
        if self.inline_commits == 1:
            return True  # compiled this engine's statements (tens of ms): not a slow disk
        self._avg_s = (1 - _WEIGHT) * self._avg_s + _WEIGHT * waited
        if self._avg_s > self.max_s:
            self._paused_until = self._clock() + self.cooldown_s
            self._avg_s = 0.0  # judged afresh when inline commits resume
            log.info(
                "inline ingest commits wait over %.1f ms on average (the last waited %.1f ms "
                "of its %.1f ms); committing on a thread for %.0f s",
                self.max_s * 1000,
                waited * 1000,
                elapsed * 1000,
                self.cooldown_s,
            )
        return True

    async def make_durable(self) -> None:
        """Make the groups committed so far durable (``syncs_wal`` only: after ``try_commit``
        returned True and before any of the group's requests is answered), without blocking
        the loop: on a native thread (``app.ingest.commit.loop_fsync``), or on a Python thread where
        that module is not built or a test has put its own ``fsync`` at the disk boundary."""
        if self.fsync is fsync_path and native_fsync_available():
            if self._loop_fsync is None:
                self._loop_fsync = LoopFsync()
            await self._loop_fsync.fsync(self._db_path + "-wal", fallback=self._db_path)
            self.native_syncs += 1
        else:
            await asyncio.to_thread(self.sync_wal)

    def sync_wal(self) -> None:
        """``make_durable``'s work on a Python thread."""
        try:
            self.fsync(self._db_path + "-wal")
        except FileNotFoundError:
            # No WAL file: the last connection closed, which checkpointed the WAL into the
            # database file (syncing both) and removed it.
            self.fsync(self._db_path)

    def maybe_checkpoint(self) -> None:
        """Start a background checkpoint when one is due and none is running (on the loop,
        after a group is durable)."""
        if self._commits_since_checkpoint < CHECKPOINT_EVERY_COMMITS:
            return
        if self._checkpointing is not None and not self._checkpointing.done():
            return
        self._commits_since_checkpoint = 0
        self._checkpointing = asyncio.get_running_loop().create_task(
            asyncio.to_thread(self._checkpoint), name="sqlite-wal-checkpoint"
        )

    def _checkpoint(self) -> None:
        # PASSIVE: copies what no reader still needs and never waits for readers or writers;
        # what it leaves, the next one copies.
        try:
            with self._checkpoint_engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").all()
        except Exception:  # a busy or failing disk: ingest goes on, the next one retries
            log.warning("background WAL checkpoint failed", exc_info=True)
            return
        self.checkpoints += 1

    async def checkpoint_finished(self) -> None:
        """Returns once no background checkpoint is running (call it before ``close``)."""
        if self._checkpointing is not None:
            await self._checkpointing

    def close(self) -> None:
        if self._loop_fsync is not None:
            self._loop_fsync.close()
        self.engine.dispose()
        self._checkpoint_engine.dispose()


class SqliteLoopCommitter:
    """The ``inline`` path, with the thread path behind it for when inline is not safe."""

    def __init__(self, inline: InlineSqliteCommitter, thread: ThreadCommitter) -> None:
        self.inline = inline
        self.thread = thread
        self.write_turns = thread.write_turns

    async def start(self) -> None:
        await asyncio.to_thread(self.inline.connect)

    async def commit(
        self,
        group: IngestGroup,
        batches: Sequence[QueuedBatch],
        phase_retention: PhaseRetention | None,
    ) -> str:
        if not self.inline.try_commit(group, phase_retention):
            return await self.thread.commit(group, batches, phase_retention)
        if self.inline.syncs_wal:  # FULL: the WAL's fsync, off the loop (see the docstring)
            await self.inline.make_durable()
        self.inline.maybe_checkpoint()  # on a thread, never in a commit on the loop
        return "inline"

    def commit_on_this_thread(
        self, batches: Sequence[QueuedBatch], phase_retention: PhaseRetention | None
    ) -> None:
        self.thread.commit_on_this_thread(batches, phase_retention)

    async def stop(self) -> None:
        await self.inline.checkpoint_finished()
        self.inline.close()
