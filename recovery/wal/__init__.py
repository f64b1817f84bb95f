"""Write-ahead log for rollout steps: nothing acknowledged is lost when a process is killed.

A step is appended (PENDING) before it runs, moves to EXECUTING, and ends COMPLETED or FAILED;
each status change is a new record and the last record of an entry wins. Bulk data lives in
files beside the log (``data/``), fsynced before the record that names them with its SHA-256.

* A call returns only once its record is on stable storage (``sync=True``). ``append_many`` and
  ``update_many`` log several changes as one record: after a crash all of them are there or none.
* Any number of threads and processes may append to one directory; one ``fdatasync`` covers
  every record written before it started (group commit).
* On open, a torn or corrupt tail is truncated; a corrupt record followed by valid ones raises
  :class:`WALCorruptionError`.
* A handle belongs to the process that opened it: a forked child opens its own (an inherited
  handle raises :class:`WALForkedError`; its ``close()`` only drops the child's copies).
  Threads may share a handle; ``close()`` waits up to ``lock_timeout`` for their calls.

Files, record format, modules and why a fork is refused: ``docs/checkpoints.md``.
"""

from recovery.wal._errors import (
    WALClosedError,
    WALCorruptionError,
    WALDataError,
    WALError,
    WALForkedError,
    WALLockTimeout,
)
from recovery.wal._index import NewEntry, StatusChange, StepType, WALEntry, WALStatus
from recovery.wal._log import (
    DEFAULT_SEGMENT_BYTES,
    MAX_SEGMENT_BYTES,
    MIN_SEGMENT_BYTES,
    WALStats,
    WriteAheadLog,
)
from recovery.wal._storage import PREALLOCATE_BYTES

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "MAX_SEGMENT_BYTES",
    "MIN_SEGMENT_BYTES",
    "PREALLOCATE_BYTES",
    "NewEntry",
    "StatusChange",
    "StepType",
    "WALClosedError",
    "WALCorruptionError",
    "WALDataError",
    "WALEntry",
    "WALError",
    "WALForkedError",
    "WALLockTimeout",
    "WALStats",
    "WALStatus",
    "WriteAheadLog",
]
