"""Turns at SQLite's one write lock between ingest and the background writers (the policy
tick's incident writes, the rollup pass).

SQLite has one writer at a time, so the background writers write in short transactions
(``app.incidents.tick_writes``, ``app.series.rollups``) and between two of them let a waiting
ingest commit go first. An ingest commit that has to wait says so before it asks SQLite
(``ingest_commit``) and is woken as soon as the background writer's current transaction ends;
a background writer starts its next transaction only once no ingest commit waits
(``background_write``). Waiting in SQLite's busy handler instead would not do: it sleeps
between tries, and a writer that starts its next transaction within a millisecond wins the
lock again and again. Each wait is bounded (``MAX_WAIT_S``), so neither side starves the other;
SQLite's busy timeout still guards against every other writer (the CLI, the workers).

Within one server process only; with PostgreSQL (row locks, no single writer) there are no
turns to take and the server passes none. Measurements: ``docs/deploy.md`` (per-node quotas).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

# The longest either side waits for the other before it goes on anyway (then SQLite's own busy
# timeout decides): a background writer's short transaction takes a few tens of milliseconds.
MAX_WAIT_S = 0.5


def background_turn(turns: WriteTurns | None) -> AbstractContextManager[None]:
    """``turns.background_write()``, or nothing to wait for where there are no turns
    (PostgreSQL)."""
    return turns.background_write() if turns is not None else nullcontext()


class WriteTurns:
    def __init__(self, max_wait_s: float = MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._background_writing = False
        self._ingest_waiting = 0
        self.ingest_first = 0  # times a background transaction waited for ingest (tests read it)

    @property
    def ingest_waiting(self) -> int:
        """Ingest commits waiting for their turn or running in it."""
        return self._ingest_waiting

    @contextmanager
    def background_write(self) -> Iterator[None]:
        """Around one of a background writer's transactions: after the ingest commits waiting
        now."""
        with self._cond:
            if self._ingest_waiting:
                self.ingest_first += 1
                self._cond.wait_for(lambda: self._ingest_waiting == 0, timeout=self.max_wait_s)
            self._background_writing = True
        try:
            yield
        finally:
            with self._cond:
                self._background_writing = False
                self._cond.notify_all()

    @contextmanager
    def ingest_commit(self) -> Iterator[None]:
        """Around an ingest commit that may wait for the lock (the group committer's thread
        path): the background writers' next transactions wait until it is done."""
        with self._cond:
            self._ingest_waiting += 1
            self._cond.wait_for(lambda: not self._background_writing, timeout=self.max_wait_s)
        try:
            yield
        finally:
            with self._cond:
                self._ingest_waiting -= 1
                self._cond.notify_all()
