"""Group commits on the event loop thread, for SQLite, when that is safe and fast.

Why: a group commit handed to a worker thread (``asyncio.to_thread``) needs the GIL back after
every SQLite call that released it (begin, each statement, commit). While the event loop is busy
parsing the next batches, each of those hand-offs waits for the loop thread to give the GIL up,
which CPython forces only every switch interval (5 ms): a commit that takes 0.6 ms alone took
5-10 ms in the server, and every ingest request waits for one. On the loop thread the same
commit costs its 0.6 ms and no hand-off.

When it would not be safe, the commit goes to the thread as before:

* the write lock is taken by someone else (the CLI, the worker, the rollup writer): this
  committer's connection has a busy timeout of 0, so the attempt fails at once, its transaction
  rolls back, and the thread path (which waits for the lock) commits the group instead;
* commits got slow (a slow disk): when the moving average of inline commit times exceeds
  ``max_ms`` (one commit more than 5x over it is enough; an isolated blip, a WAL checkpoint or the process
  being descheduled for a moment is not) the thread path is used for ``cooldown_s``, so a slow
  disk never stalls the loop for long, and inline is tried again afterwards;
* PostgreSQL (network round trips, a server that can hang) and the shared Redis window are
  never committed inline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from app.core.db import is_sqlite, make_engine
from app.ingest.persist import IngestGroup, write_ingest_group
from app.ingest.phases import PhaseRetention

log = logging.getLogger("rlguard.ingest")


# Weight of the newest commit in the moving average: a single commit more than 5x over the
# limit trips it, five in a row 1.5x over do too, one 2x blip among fast commits does not.
_WEIGHT = 0.2


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
    ) -> None:
        if not is_sqlite(url):
            raise ValueError("inline commits are for SQLite only")
        # One connection, used only from the event loop thread.
        self.engine: Engine = make_engine(
            url,
            sqlite_synchronous=sqlite_synchronous,
            sqlite_busy_timeout_ms=0,
            pool_size=1,
            max_overflow=0,
        )
        self.max_s = max_ms / 1000.0
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._timer = timer  # measures commits (injectable for tests)
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
        started = self._timer()
        try:
            write_ingest_group(self.engine, group, phase_retention=phase_retention)
        except OperationalError as exc:
            if not _is_lock_conflict(exc):
                raise
            self.fallbacks += 1
            return False  # rolled back by write_ingest_group's transaction
        elapsed = self._timer() - started
        self.inline_commits += 1
        if self.inline_commits == 1:
            return True  # compiled this engine's statements (tens of ms): not a slow disk
        self._avg_s = (1 - _WEIGHT) * self._avg_s + _WEIGHT * elapsed
        if self._avg_s > self.max_s:
            self._paused_until = self._clock() + self.cooldown_s
            self._avg_s = 0.0  # judged afresh when inline commits resume
            log.info(
                "inline ingest commits average over %.1f ms (last %.1f ms); committing on a "
                "thread for %.0f s",
                self.max_s * 1000,
                elapsed * 1000,
                self.cooldown_s,
            )
        return True

    def close(self) -> None:
        self.engine.dispose()
