"""Write-ahead log for rollout steps: nothing acknowledged is lost when a process is killed.

A step is appended (PENDING) before it runs, moves to EXECUTING, and ends COMPLETED or FAILED.
Status changes are appended as new records, never rewritten in place; the last record of an
entry wins. Bulk data lives in files beside the log (``data/``), fsynced before the record that
names them; the record holds the path and a SHA-256 checksum.

Durability and concurrency:

* a call returns only once its record is on stable storage (``sync=True``);
* ``append_many`` and ``update_many`` log several changes (a rollout step's records) as one
  record: one wait for one sync instead of one per change, and after a crash the changes are
  all there or none is;
* any number of threads and processes may append to one directory: records are serialized by
  the append lock, and fsyncs are shared through the sync lock and the shared durable mark
  (``_locks``) so one ``fdatasync`` covers every record written before it started (group
  commit, ``_groupcommit``); the threads of one process hand their records to one of them,
  which writes them together (``_combine``);
* the segment being written is preallocated with zeros ahead of the records, and every record
  is followed by a zero header that marks the end (``_format``): a sync then flushes data
  only, with no size or block change to commit through the file system journal.
  A record written while nothing else is in flight goes out with one ``RWF_DSYNC`` write;
* on open, a torn or corrupt tail (a writer killed mid-record, a flipped byte in the last
  record) is truncated; a corrupt record followed by valid ones raises
  :class:`WALCorruptionError`.

Layout of ``directory``: ``wal-<16 digits>.log`` segments, ``data/`` files, ``wal.state`` (the
shared positions), ``append.lock`` and ``sync.lock``.

Processes and threads (the rule for ``fork``):

* a handle belongs to the process that opened it. A forked child (``os.fork``,
  ``multiprocessing`` with the fork start method, a Celery prefork pool child) must open its
  own :class:`WriteAheadLog`; every method of an inherited handle raises
  :class:`WALForkedError` and ``close()`` in the child only drops the child's copies of the
  descriptors and the mapping. The reasons: ``flock`` locks belong to the open file
  description, which parent and child share after a fork, so an inherited handle would not
  exclude the parent (two writers at one position) and its unlock would release the parent's
  lock; and the in-process group-commit state (the process leader, the lock mutexes) is copied
  as it was at the fork, possibly mid-commit, so the child could wait for a leader that does
  not exist in it. Handles opened separately in each process share fsyncs as intended;
* threads of one process may share a handle. ``close()`` waits (up to ``lock_timeout``) for
  the calls other threads have in flight, so it never pulls the descriptors or the shared
  mapping from under a running group commit.

The package: ``_log`` (the handle and its calls), ``_storage`` (writing, syncing and reading the
files), ``_args`` (argument checks), ``_index`` (entries and the in-memory index), ``_format``
(the record format), ``_segments`` and ``_data`` (the files), ``_locks``, ``_futex``,
``_groupcommit`` and ``_combine`` (concurrency).
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
