"""Errors raised by the write-ahead log (:mod:`recovery.wal`).

They live in their own module so the WAL's private helpers can raise them without importing
:mod:`recovery.wal` itself.
"""

from __future__ import annotations

from pathlib import Path

from recovery.errors import RecoveryError, RecoveryTimeout


class WALError(RecoveryError):
    """A write-ahead-log operation was refused or failed; nothing was written."""


class WALClosedError(WALError):
    """The log was used after :meth:`~recovery.wal.WriteAheadLog.close`."""


class WALForkedError(WALError):
    """A handle was used in a process forked from the one that opened it.

    A handle belongs to its process: open a new :class:`~recovery.wal.WriteAheadLog` in the
    child (see the module documentation of :mod:`recovery.wal` for why).
    """


class WALLockTimeout(WALError, RecoveryTimeout):
    """A lock of the log could not be taken within the caller's ``timeout``."""


class WALCorruptionError(WALError):
    """A record inside the log (not at its tail) fails its checksum or cannot be decoded.

    Such a record is reported rather than skipped: skipping it would silently drop an
    acknowledged status change, and ``recover()`` would then answer wrongly.
    """

    def __init__(self, segment: Path, offset: int, reason: str) -> None:
        super().__init__(f"corrupt WAL record in {segment} at byte {offset}: {reason}")
        self.segment = segment
        self.offset = offset
        self.reason = reason


class WALDataError(WALError):
    """A data file referenced by an entry is missing or does not match its checksum."""
