"""A full disk under the database: say so, and answer at once while it lasts.

When the database's disk (or its quota) is full, every group commit fails the same way until
an operator frees space. Without this, each ingest request waited the whole commit timeout
(10 s) for a commit that could not happen and was then told only that it "could not be
committed in time", while hundreds of agents' retries each held a request open for those 10 s.

So the group committer reports each failed commit here. A failure whose cause is a full disk
(SQLite's ``SQLITE_FULL``, PostgreSQL's ``disk_full`` 53100, ``ENOSPC``/``EDQUOT`` from a write or
an fsync) opens a short circuit: for ``hold_seconds`` new batches are refused at once with a 503
that names the cause, before anything of them is applied, and the requests already waiting for
a commit are answered the same way at once (their batches stay queued and are committed, and
acknowledged as duplicates, once there is space). After ``hold_seconds`` requests go through
again, so the first commit after space is freed is not delayed; the committer's next failure
opens the circuit again.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from app.core.errors import Unavailable

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_POSTGRES_DISK_FULL = "53100"


def storage_full_cause(exc: BaseException) -> str | None:
    """How ``exc`` says the database's storage is full, or None when it is another failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cause = _cause_of_one(current)
        if cause is not None:
            return cause
        if isinstance(current, DBAPIError) and current.orig is not None:
            current = current.orig
        else:
            current = current.__cause__ or current.__context__
    return None


def _cause_of_one(exc: BaseException) -> str | None:
    code = getattr(exc, "sqlite_errorcode", None)  # set on errors SQLite itself returned
    if isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        return f"database disk is full (SQLITE_FULL: {_first_line(exc)})"
    if getattr(exc, "sqlstate", None) == _POSTGRES_DISK_FULL:  # psycopg's DiskFull
        return f"database disk is full (PostgreSQL disk_full: {_first_line(exc)})"
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return f"database disk is full ({errno.errorcode[exc.errno]}: {exc.strerror})"
    return None


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


class StorageFullCircuit:
    """Open for ``hold_seconds`` after a commit failed because storage is full."""

    def __init__(self, hold_seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._cause: str | None = None
        self._open_until = 0.0

    def commit_failed(self, exc: BaseException) -> bool:
        """Note a failed group commit; True when it opened (or renewed) the circuit."""
        cause = storage_full_cause(exc)
        if cause is None:
            return False
        self._cause = cause
        self._open_until = self._clock() + self.hold_seconds
        return True

    def commit_succeeded(self) -> None:
        self._cause = None
        self._open_until = 0.0

    def refusal(self) -> Unavailable | None:
        """The 503 for a new batch while the circuit is open; None when it may be tried."""
        if self._cause is None:
            return None
        left = self._open_until - self._clock()
        if left <= 0:
            return None
        return Unavailable(
            f"{self._cause}; nothing of this batch was applied, retry the same seq in "
            f"{max(1, round(left))} s"
        )

    def waiting_answer(self) -> Unavailable:
        """The 503 for a request whose batch is applied in memory and waits for its commit."""
        return Unavailable(
            f"{self._cause or 'database disk is full'}; the batch is applied in memory but not "
            "yet committed to the database, retry the same seq"
        )
