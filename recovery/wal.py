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
  (:mod:`recovery._wal_locks`) so one ``fdatasync`` covers every record written before it
  started (group commit, :mod:`recovery._wal_groupcommit`); the threads of one process hand
  their records to one of them, which writes them together (:mod:`recovery._wal_combine`);
* the segment being written is preallocated with zeros ahead of the records, and every record
  is followed by a zero header that marks the end (:mod:`recovery._wal_format`): a sync then
  flushes data only, with no size or block change to commit through the file system journal.
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
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from recovery._wal_args import (
    ChangeChecked,
    NewChecked,
    change_fields,
    check_change,
    check_new,
    encode_changes,
    item_list,
    new_entry_fields,
)
from recovery._wal_combine import Call, CallQueue
from recovery._wal_data import (
    checksum_bytes,
    checksum_file,
    fsync_file,
    read_verified,
    unreferenced_data_files,
    write_data_file,
)
from recovery._wal_errors import (
    WALClosedError,
    WALCorruptionError,
    WALDataError,
    WALError,
    WALForkedError,
    WALLockTimeout,
)
from recovery._wal_format import END_MARK, DecodedRecord, encode_record, scan
from recovery._wal_groupcommit import GroupCommit
from recovery._wal_index import (
    EntryIndex,
    NewEntry,
    StatusChange,
    StepType,
    WALEntry,
    WALStatus,
    check_entry_id,
)
from recovery._wal_locks import MAX_SEGMENT_OFFSET, ProcessLock, SharedState, read_boot_id
from recovery._wal_segments import SegmentDirectory, read_range

__all__ = [
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

logger = logging.getLogger("rlguard.recovery.wal")

DEFAULT_SEGMENT_BYTES = 64 << 20
MIN_SEGMENT_BYTES = 1024
# Offsets must fit the shared durable mark; a record may start just below the limit.
MAX_SEGMENT_BYTES = MAX_SEGMENT_OFFSET - (2 << 20)
# Zeros written ahead of the records at a time (one fdatasync with a journal commit per this
# many bytes of records, about 2,000 of them).
PREALLOCATE_BYTES = 256 << 10
# A write that returns once its data is on stable storage (Linux 4.7+), where available.
_RWF_DSYNC: int | None = getattr(os, "RWF_DSYNC", None)
# What pwritev answers when it does not know the flag (it then writes nothing).
_FLAG_REFUSED = {errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS}


def _disable_rwf_dsync() -> None:
    global _RWF_DSYNC
    _RWF_DSYNC = None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _tracked(
    method: Callable[Concatenate[WriteAheadLog, _P], _R],
) -> Callable[Concatenate[WriteAheadLog, _P], _R]:
    """Count the call as in flight, so that ``close()`` waits for it to finish."""

    @functools.wraps(method)
    def wrapper(self: WriteAheadLog, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self._begin_operation()
        try:
            return method(self, *args, **kwargs)
        finally:
            self._end_operation()

    return wrapper


@dataclass(frozen=True, slots=True)
class _Written:
    """What a batch wrote: the end of its last record and, if this thread is to lead the
    sync, the leader's snapshot (position, records count, descriptor)."""

    end: tuple[int, int]
    leader: tuple[tuple[int, int], int, int] | None


@dataclass(frozen=True)
class WALStats:
    """What this handle did since it was opened: records it wrote, the group-commit fsyncs it
    ran and the seconds those took.

    With group commit, ``fsyncs`` summed over all writers stays well below ``records``.
    """

    records: int
    fsyncs: int
    sync_seconds: float = 0.0


class WriteAheadLog:
    """A crash-safe, multi-process write-ahead log of rollout steps in ``directory``.

    ``sync=False`` skips every fsync (records still survive a killed process, not a power
    loss); ``segment_bytes`` is the size at which a new segment file is started;
    ``lock_timeout`` bounds every wait for another writer, in seconds.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        sync: bool = True,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        lock_timeout: float = 30.0,
    ) -> None:
        if isinstance(segment_bytes, bool) or not isinstance(segment_bytes, int):
            raise WALError(f"segment_bytes must be an int, got {segment_bytes!r}")
        if not MIN_SEGMENT_BYTES <= segment_bytes <= MAX_SEGMENT_BYTES:
            raise WALError(
                f"segment_bytes={segment_bytes} is outside {MIN_SEGMENT_BYTES}..{MAX_SEGMENT_BYTES}"
            )
        if not isinstance(lock_timeout, int | float) or not lock_timeout > 0:
            raise WALError(
                f"lock_timeout must be a positive number of seconds, got {lock_timeout!r}"
            )
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / "data").mkdir(exist_ok=True)
        except OSError as exc:
            raise WALError(f"cannot create WAL directory {self.directory}: {exc}") from exc
        self._sync = bool(sync)
        self._segment_bytes = segment_bytes
        self._timeout = float(lock_timeout)
        self._segments = SegmentDirectory(self.directory, sync=self._sync)
        try:
            self._append_lock = ProcessLock(self.directory / "append.lock")
            self._sync_lock = ProcessLock(self.directory / "sync.lock")
        except OSError as exc:
            raise WALError(f"cannot open the lock files of WAL {self.directory}: {exc}") from exc
        self._closed = False
        self._closing = False
        # The process that owns the handle (see "the rule for fork" above).
        self._pid = os.getpid()
        self._ops = threading.Condition()
        self._in_flight = 0
        self._index = EntryIndex(self.directory)
        self._cursor = (0, 0)
        self._generation = -1
        self._seg_no = 0
        self._seg_fd = -1
        self._records_written = 0  # changed under the append lock
        # This handle's slot in the shared state: write calls in flight, for sync leaders.
        self._slot: int | None = None
        self._calls = CallQueue(self._publish_in_flight, self._timeout)
        try:
            self._sync_lock.acquire(self._timeout)
            try:
                self._append_lock.acquire(self._timeout)
                try:
                    self._state = SharedState(self.directory / "wal.state")
                    self._append_lock.attach_counter(self._state.append_released)
                    self._sync_lock.attach_counter(self._state.sync_released)
                    self._group = GroupCommit(self._state, self._sync_lock, self._snapshot_for_sync)
                    try:
                        self._open_locked()
                    except BaseException:
                        self._detach_counters()
                        self._state.close()
                        raise
                finally:
                    self._append_lock.release()
            finally:
                self._sync_lock.release()
        except BaseException as exc:
            if self._seg_fd >= 0:
                os.close(self._seg_fd)
            self._append_lock.close()
            self._sync_lock.close()
            if isinstance(exc, OSError):
                raise WALError(f"cannot open WAL {self.directory}: {exc}") from exc
            raise

    # ------------------------------------------------------------------ public API

    @_tracked
    def append(
        self,
        entry_id: str,
        step_type: StepType | str,
        *,
        data: bytes | None = None,
        data_path: str | os.PathLike[str] | None = None,
    ) -> WALEntry:
        """Log a new PENDING step and return once the record is durable.

        ``data`` is written to a file under ``data/`` and fsynced first; ``data_path`` names a
        file the caller already wrote (it is fsynced and checksummed, not copied). Raises
        :class:`WALError` without writing anything for an empty id, an unknown step type, an
        id already in the log, or both/invalid data arguments.
        """
        self._check_open()
        return self._append_checked([check_new(entry_id, step_type, data, data_path)])[0]

    @_tracked
    def append_many(
        self, entries: Iterable[NewEntry | tuple[str, StepType | str]]
    ) -> list[WALEntry]:
        """Log several new PENDING steps with one record; return once it is durable.

        Each item is a :class:`NewEntry` or an ``(entry_id, step_type)`` pair. The entries
        survive a crash together or not at all (one record, one checksum), and the call waits
        for one sync instead of one per entry: a rollout step that produces several records
        logs them this way. Everything is checked before anything is written: a bad item, an
        id given twice or an id already in the log raises :class:`WALError` naming it and
        writes nothing, not even the other entries' data files. An empty list writes nothing.
        """
        self._check_open()
        items = item_list(entries, "append_many", "entries")
        checked = [check_new(*new_entry_fields(item, n)) for n, item in enumerate(items)]
        seen: set[str] = set()
        for item in checked:
            if item.eid in seen:
                raise WALError(f"entry {item.eid!r} is given twice in one append_many")
            seen.add(item.eid)
        return self._append_checked(checked) if checked else []

    @_tracked
    def update_status(
        self, entry_id: str, status: WALStatus | str, *, error: str | None = None
    ) -> WALEntry:
        """Append a status change for an existing entry; return once it is durable.

        ``error`` may only accompany FAILED. Raises :class:`WALError` (writing nothing) for an
        unknown status, an unknown entry or a change out of COMPLETED; re-marking a COMPLETED
        entry COMPLETED is a no-op.
        """
        self._check_open()
        return self._update_checked([check_change(entry_id, status, error)])[0]

    @_tracked
    def update_many(
        self, changes: Iterable[StatusChange | tuple[str, WALStatus | str]]
    ) -> list[WALEntry]:
        """Apply several status changes with one record; return once it is durable.

        Each item is a :class:`StatusChange` or an ``(entry_id, status)`` pair; they apply in
        order (one entry may move twice, e.g. to EXECUTING and then COMPLETED) and survive a
        crash together or not at all. If any change is refused (the rules of
        :meth:`update_status`), :class:`WALError` names it and none is written. Returns each
        entry's state after its change, in the order given.
        """
        self._check_open()
        items = item_list(changes, "update_many", "changes")
        checked = [check_change(*change_fields(item, n)) for n, item in enumerate(items)]
        return self._update_checked(checked) if checked else []

    def _append_checked(self, items: list[NewChecked]) -> list[WALEntry]:
        """Write the data files of checked new entries, then their record; wait for it."""
        eids = [item.eid for item in items]
        if any(item.data is not None or item.external is not None for item in items):
            # Fail before writing a data file when an id is already known.
            with self._locked_append():
                self._refuse_known(eids)
        owned_files: list[Path] = []
        try:
            now = time.time()
            entries: list[WALEntry] = []
            payloads: list[dict[str, Any]] = []
            for item in items:
                stored_path, checksum, owned = self._store_data(item)
                if owned is not None:
                    owned_files.append(owned)
                entries.append(
                    WALEntry(
                        entry_id=item.eid,
                        step_type=item.step,
                        status=WALStatus.PENDING,
                        data_path=self._index.resolve(stored_path),
                        checksum=checksum,
                        created_at=now,
                        updated_at=now,
                    )
                )
                payloads.append(
                    {
                        "k": "a",
                        "id": item.eid,
                        "t": item.step.value,
                        "s": WALStatus.PENDING.value,
                        "ts": now,
                        "p": stored_path,
                        "c": checksum,
                    }
                )
            record = encode_changes(payloads)

            def prepare() -> tuple[bytes | None, list[WALEntry]]:
                self._refuse_known(eids)
                return record, entries

            return self._write_and_wait(record, prepare)
        except BaseException:
            for owned in owned_files:
                owned.unlink(missing_ok=True)
            raise

    def _refuse_known(self, eids: list[str]) -> None:
        """Raise :class:`WALError` for the first id the log already holds (index up to date)."""
        for eid in eids:
            if eid in self._index:
                raise WALError(f"entry {eid!r} is already in the log")

    def _store_data(self, item: NewChecked) -> tuple[str | None, str | None, Path | None]:
        """Make an entry's data durable: (path as the record holds it, checksum, the file
        this call created, to delete if the append fails)."""
        if item.data is not None:
            content = bytes(item.data)
            owned = write_data_file(self.directory / "data", item.eid, content, sync=self._sync)
            return owned.relative_to(self.directory).as_posix(), checksum_bytes(content), owned
        if item.external is not None:
            if self._sync:
                fsync_file(item.external)
            return str(item.external.resolve()), checksum_file(item.external), None
        return None, None, None

    def _update_checked(self, changes: list[ChangeChecked]) -> list[WALEntry]:
        """Write checked status changes as one record (those that change something); wait."""
        now = time.time()
        payloads = [
            {"k": "s", "id": c.eid, "s": c.status.value, "ts": now, "e": c.error} for c in changes
        ]
        record = encode_changes(payloads)

        def prepare() -> tuple[bytes | None, list[WALEntry]]:
            # Later changes of one call see the earlier ones; the index is left untouched
            # until every change is accepted.
            pending: dict[str, WALEntry] = {}
            results: list[WALEntry] = []
            written: list[dict[str, Any]] = []
            for change, payload in zip(changes, payloads, strict=True):
                current = pending.get(change.eid) or self._index.get(change.eid)
                if current is None:
                    raise WALError(f"cannot set status of unknown entry {change.eid!r}")
                if current.status is WALStatus.COMPLETED:
                    if change.status is WALStatus.COMPLETED:
                        # A retry of the final update after a crash: nothing to change or write.
                        results.append(current)
                        continue
                    raise WALError(
                        f"entry {change.eid!r} is COMPLETED; it cannot move to {change.status}"
                    )
                updated = replace(current, status=change.status, updated_at=now, error=change.error)
                pending[change.eid] = updated
                results.append(updated)
                written.append(payload)
            if not written:
                return None, results
            return (record if len(written) == len(payloads) else encode_changes(written)), results

        return self._write_and_wait(record, prepare)

    @_tracked
    def recover(self) -> list[WALEntry]:
        """Every entry whose last status is not COMPLETED, in append order (as of now)."""
        with self._locked_append():
            return [e for e in self._index.all() if e.status is not WALStatus.COMPLETED]

    @_tracked
    def get(self, entry_id: str) -> WALEntry | None:
        """The latest state of ``entry_id``, or None if the log does not hold it."""
        eid = check_entry_id(entry_id)
        with self._locked_append():
            return self._index.get(eid)

    @_tracked
    def entries(self) -> list[WALEntry]:
        """All entries the log holds, in append order."""
        with self._locked_append():
            return self._index.all()

    @_tracked
    def read_data(self, entry_id: str) -> bytes:
        """The bytes of an entry's data file, after checking them against the checksum."""
        entry = self.get(entry_id)
        if entry is None:
            raise WALError(f"unknown entry {entry_id!r}")
        if entry.data_path is None or entry.checksum is None:
            raise WALDataError(f"entry {entry_id!r} has no data file")
        return read_verified(entry.data_path, entry.checksum, entry_id)

    @_tracked
    def compact(self, *, delete_data: bool = True, orphan_grace_s: float = 3600.0) -> int:
        """Drop COMPLETED entries from the log, atomically; return how many were dropped.

        The surviving entries are written, with their current state, into one new segment that
        starts with a marker saying it supersedes every older segment; it is fsynced and renamed
        into place before the old segments are deleted, so a crash at any point leaves either
        the old or the new history, never a mix. With ``delete_data`` the data files the log
        wrote itself (under ``data/``) for dropped entries are deleted afterwards, and so are
        files there that no entry names and that are older than ``orphan_grace_s`` (left by a
        process killed between writing its data and its record; the grace keeps the file of
        an append that is still on its way).
        """
        if not isinstance(orphan_grace_s, int | float) or not orphan_grace_s >= 0:
            raise WALError(f"orphan_grace_s must be a number >= 0, got {orphan_grace_s!r}")
        self._check_open()
        self._sync_lock.acquire(self._timeout)
        try:
            self._append_lock.acquire(self._timeout)
            try:
                self._catch_up_locked()
                everything = self._index.all()
                kept = [e for e in everything if e.status is not WALStatus.COMPLETED]
                dropped = [e for e in everything if e.status is WALStatus.COMPLETED]
                new_seg = self._state.write_position()[0] + 1
                records = [encode_record({"k": "base", "seg": new_seg, "ts": time.time()})]
                records += [encode_record(self._index.snapshot_payload(e)) for e in kept]
                end = self._segments.install_compacted(new_seg, b"".join(records))
                self._state.set_write_position(new_seg, end)
                self._state.set_zeroed_end(end)
                self._state.advance_durable(new_seg, end)
                self._state.bump_generation()
                self._segments.remove_below(new_seg)
                self._full_scan_locked()
                referenced = {e.data_path for e in self._index.all()}
                orphans = unreferenced_data_files(
                    self.directory / "data", referenced, orphan_grace_s
                )
            finally:
                self._append_lock.release()
        finally:
            self._sync_lock.release()
        if delete_data:
            for entry in dropped:
                if (
                    entry.data_path is not None
                    and entry.data_path.parent == self.directory / "data"
                ):
                    entry.data_path.unlink(missing_ok=True)
            for orphan in orphans:
                orphan.unlink(missing_ok=True)
                logger.warning("WAL %s: removed orphaned data file %s", self.directory, orphan)
        logger.info(
            "compacted WAL %s: dropped %d completed entries, kept %d",
            self.directory,
            len(dropped),
            len(kept),
        )
        return len(dropped)

    def stats(self) -> WALStats:
        """Records written and fsyncs run by this handle since it was opened."""
        return WALStats(
            records=self._records_written,
            fsyncs=self._group.fsyncs,
            sync_seconds=self._group.sync_seconds,
        )

    def close(self) -> None:
        """Release the log's files; later calls raise :class:`WALClosedError`. Idempotent.

        Waits up to ``lock_timeout`` for calls other threads have in flight (then raises
        :class:`WALLockTimeout` and leaves the handle open). In a forked child it only drops the
        child's copies of the files and never touches the locks the parent may hold.
        """
        if os.getpid() != self._pid:
            self._release_files()
            return
        deadline = time.monotonic() + self._timeout
        with self._ops:
            while self._closing:  # another thread is closing: wait for its outcome
                if not self._ops.wait(max(deadline - time.monotonic(), 0.0)):
                    raise WALLockTimeout(f"WAL {self.directory}: another close() did not finish")
            if self._closed:
                return
            self._closing = True
            try:
                while self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise WALLockTimeout(
                            f"WAL {self.directory} not closed: {self._in_flight} call(s) of "
                            f"other threads still running after {self._timeout:g}s"
                        )
                    self._ops.wait(remaining)
                self._release_files()
            finally:
                self._closing = False
                self._ops.notify_all()

    def _release_files(self) -> None:
        """Close descriptors, unmap the shared state; no call of this handle may be running."""
        if self._closed:
            return
        self._closed = True
        if self._seg_fd >= 0:
            os.close(self._seg_fd)
            self._seg_fd = -1
        if self._slot is not None and os.getpid() == self._pid:
            self._state.set_slot(self._slot, 0, 0)
            self._slot = None
        self._detach_counters()
        self._state.close()
        self._append_lock.close()
        self._sync_lock.close()

    def _begin_operation(self) -> None:
        # Checked before any lock is touched: in a forked child the copied locks may be held
        # by a thread that exists only in the parent.
        if os.getpid() != self._pid:
            raise WALForkedError(
                f"WAL {self.directory} was opened in process {self._pid} and is used in "
                f"process {os.getpid()} after a fork; open a new WriteAheadLog in this process"
            )
        with self._ops:
            if self._closed or self._closing:
                raise WALClosedError(f"WAL {self.directory} is closed")
            self._in_flight += 1

    def _end_operation(self) -> None:
        with self._ops:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._ops.notify_all()

    def _detach_counters(self) -> None:
        self._append_lock.attach_counter(None)
        self._sync_lock.attach_counter(None)

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def _write_and_wait(
        self, record: bytes, prepare: Callable[[], tuple[bytes | None, list[WALEntry]]]
    ) -> list[WALEntry]:
        """Write one record and return once it is durable.

        ``prepare`` runs under the append lock against an up-to-date index: it raises to refuse
        the change, or returns the record to write (``record``, a smaller one, or None when
        nothing changes) and what the entries become. The record may be written by another
        thread of this process together with its own (:mod:`recovery._wal_combine`).
        """
        call = Call(record, prepare, time.monotonic() + self._timeout)
        try:
            entries: list[WALEntry] = self._calls.run(call, self._write_batch, self._make_durable)
            return entries
        finally:
            # A gathering leader may have waited for this call (now finished) to come back.
            self._state.nudge_gatherer()

    def _write_batch(self, batch: list[Call], deadline: float) -> _Written | None:
        """Write the records of ``batch`` that ``prepare`` accepts, under one append lock."""
        self._append_lock.acquire(max(deadline - time.monotonic(), 0.0))
        try:
            self._check_open()
            self._catch_up_locked()
            accepted: list[tuple[Call, list[WALEntry]]] = []
            for call in batch:
                try:
                    record, entries = call.prepare()
                except Exception as exc:  # refused: this call fails, the others go on
                    call.error = exc
                    continue
                if record is None:
                    call.result = entries
                    continue
                call.record = record
                for entry in entries:
                    self._index.put(entry)  # the next call's prepare must see this change
                accepted.append((call, entries))
            if not accepted:
                return None
            try:
                if len(accepted) == 1 and self._write_durable_alone_locked(accepted[0][0].record):
                    self._records_written += 1
                    accepted[0][0].result, accepted[0][0].position = accepted[0][1], self._cursor
                    return None  # durable already: nothing left to wait for
                ends, records = self._write_records_locked([c.record for c, _ in accepted])
            except BaseException as exc:
                # The index holds changes the log may not: rebuild it from what is there.
                self._full_scan_locked()
                if isinstance(exc, OSError):
                    raise WALError(f"cannot write to WAL {self.directory}: {exc}") from exc
                raise
            self._records_written += len(accepted)
            for (call, entries), end in zip(accepted, ends, strict=True):
                call.result, call.position = entries, end
            last = ends[-1]
            if self._sync and self._group.try_lead_now():
                # Nobody here or elsewhere is syncing: lead, from the batch's end.
                try:
                    return _Written(last, (last, records, os.dup(self._seg_fd)))
                except BaseException:
                    self._group.lead_failed()
                    raise
            return _Written(last, None)
        finally:
            self._append_lock.release()
            self._state.nudge_gatherer()  # a gathering leader may wait for these records

    def _make_durable(self, written: _Written, deadline: float) -> None:
        """Return once everything up to ``written.end`` is on stable storage."""
        if not self._sync:
            return
        try:
            if written.leader is not None:
                self._group.lead(written.leader, deadline)
            else:
                self._group.wait(written.end, deadline)
        except WALError:
            raise  # a lock timeout is a TimeoutError (an OSError) but not a failed fsync
        except OSError as exc:
            # After a failed fsync the page cache may have dropped the dirty pages: the
            # records must be treated as lost. Reopening the log shows what is on disk.
            raise WALError(
                f"fsync of WAL {self.directory} failed ({exc}); the record may not be "
                "durable, reopen the log before continuing"
            ) from exc

    def _publish_in_flight(self, calls: int) -> None:
        """Show sync leaders how many write calls this handle has in flight."""
        if self._slot is not None:
            self._state.set_slot(self._slot, self._pid, calls)

    def _write_durable_alone_locked(self, record: bytes) -> bool:
        """Write ``record`` and make it durable in one system call, if nothing else needs a
        sync: no other write call is in flight anywhere and every record before it is
        durable already. Then ``pwritev`` with ``RWF_DSYNC`` does what a write, a sync leader
        election and an ``fdatasync`` would (the flush covers this record's range only,
        which is enough because everything before it is durable). False if it did nothing.
        """
        if not self._sync or _RWF_DSYNC is None:
            return False
        seg, end = self._state.write_position()
        stop = end + len(record)
        if (
            (end > 0 and stop > self._segment_bytes)
            or stop + len(END_MARK) > self._state.zeroed_end()
            or self._state.durable_position() != (seg, end)
            or self._state.calls_in_flight() > 1
        ):
            return False
        self._ensure_segment_fd(seg)
        start = time.perf_counter()
        try:
            written = os.pwritev(self._seg_fd, [record, END_MARK], end, _RWF_DSYNC)
        except OSError as exc:
            if exc.errno not in _FLAG_REFUSED:
                raise
            _disable_rwf_dsync()  # a kernel or file system without it: use fdatasync
            return False
        elapsed = time.perf_counter() - start
        if written != len(record) + len(END_MARK):
            raise WALError(
                f"short write to WAL segment {seg}: {written} of {len(record) + len(END_MARK)}"
                " bytes"
            )
        self._state.set_write_position(seg, stop)
        self._cursor = (seg, stop)
        self._state.count_records(1)
        # Another leader may raise the mark at the same time to a position before ours (its
        # snapshot predates our record); the mark then claims less than is durable, never more.
        self._state.advance_durable(seg, stop)
        self._state.note_sync(self._state.records_written(), elapsed)
        self._group.count_sync(elapsed)
        return True

    def _write_records_locked(self, records: list[bytes]) -> tuple[list[tuple[int, int]], int]:
        """Write ``records`` in order at the write position; return each one's end and the
        count of records written so far. Those that fit the segment go in one ``pwrite``."""
        ends: list[tuple[int, int]] = []
        index = 0
        while index < len(records):
            seg, end = self._state.write_position()
            if end > 0 and end + len(records[index]) > self._segment_bytes:
                self._rotate_locked(seg, end)
                seg, end = seg + 1, 0
            # The first record always goes (alone in a fresh segment if it is that big).
            stop, first = end + len(records[index]), index
            index += 1
            while index < len(records) and stop + len(records[index]) <= self._segment_bytes:
                stop += len(records[index])
                index += 1
            group = records[first:index]
            self._ensure_segment_fd(seg)
            if stop + len(END_MARK) > self._state.zeroed_end():
                self._preallocate_locked(seg, end, stop + len(END_MARK))
            # The end mark after the records also covers what a writer killed before its
            # record counted may have left here, so a reader never takes it for a record.
            framed = b"".join([*group, END_MARK])
            written = os.pwrite(self._seg_fd, framed, end)
            if written != len(framed):
                raise WALError(
                    f"short write to WAL segment {seg}: {written} of {len(framed)} bytes"
                )
            for record in group:
                end += len(record)
                ends.append((seg, end))
            self._state.set_write_position(seg, end)
            self._cursor = (seg, end)
            self._state.count_records(len(group))
        return ends, self._state.records_written()

    def _preallocate_locked(self, seg: int, end: int, stop: int) -> None:
        """Zero-fill the segment from ``end`` to at least ``stop`` and make that durable.

        Records then overwrite blocks that already exist within the file's size, so the
        ``fdatasync`` that makes them durable flushes data only: no block allocation or size
        change to commit through the file system journal, which is what makes an fsync of a
        growing file slow (the same reason PostgreSQL and RocksDB preallocate their logs).
        """
        size = os.fstat(self._seg_fd).st_size
        if size < end:
            raise WALCorruptionError(
                self._segments.path(seg), size, f"segment is shorter than its recorded end {end}"
            )
        target = max(stop, min(end + PREALLOCATE_BYTES, self._segment_bytes + len(END_MARK)))
        zeros = memoryview(bytes(target - end))
        position = end
        try:
            while zeros:
                count = os.pwrite(self._seg_fd, zeros, position)
                zeros, position = zeros[count:], position + count
            if self._sync:
                os.fdatasync(self._seg_fd)
        except OSError:
            # Out of space or over a size limit: give back what was added; nothing was logged.
            with suppress(OSError):
                os.ftruncate(self._seg_fd, size)
            raise
        self._state.set_zeroed_end(target)

    def _rotate_locked(self, seg: int, end: int) -> None:
        """Close segment ``seg`` at ``end`` (cut its zeros, make it durable), start the next.

        Every step leaves a state the next writer continues from if this one is killed: the
        zeroed end drops to 0 first (nothing prepared), and the write position moves to the new
        segment only once it exists.
        """
        self._ensure_segment_fd(seg)
        self._state.set_zeroed_end(0)
        os.ftruncate(self._seg_fd, end)
        if self._sync:
            os.fdatasync(self._seg_fd)
        self._segments.create(seg + 1)
        self._state.set_write_position(seg + 1, 0)

    def _snapshot_for_sync(self, timeout: float) -> tuple[tuple[int, int], int, int]:
        """The write position, the records written before it and a descriptor of its segment,
        for a sync leader."""
        self._append_lock.acquire(timeout)
        try:
            target = self._state.write_position()
            self._ensure_segment_fd(target[0])
            return target, self._state.records_written(), os.dup(self._seg_fd)
        finally:
            self._append_lock.release()

    # ------------------------------------------------------------------ reading

    @contextmanager
    def _locked_append(self) -> Iterator[None]:
        """Hold the append lock with the index brought up to date (for reads)."""
        self._check_open()
        self._append_lock.acquire(self._timeout)
        try:
            self._check_open()
            self._catch_up_locked()
            yield
        finally:
            self._append_lock.release()

    def _open_locked(self) -> None:
        """Open in this process: repair the files if needed, reset the shared positions, load."""
        boot_id = read_boot_id()
        valid = self._state.is_valid_for(boot_id)
        repaired = self._segments.repair()
        seg, end = repaired.last_segment, repaired.valid_end
        if self._sync:
            # Earlier segments were fsynced when the log rotated past them; after this the
            # whole log is durable and the durable mark can say so.
            self._segments.fsync_segment(seg)
        generation = self._state.generation + (1 if repaired.changed or not valid else 0)
        self._state.reset(boot_id, generation, seg, end, repaired.zeroed_end)
        if not valid:
            self._state.clear_slots()
        self._slot = self._state.claim_slot(self._pid)
        self._full_scan_locked()

    def _full_scan_locked(self) -> None:
        self._index.clear()
        self._generation = self._state.generation
        write_seg, write_end = self._state.write_position()
        for seg in self._segments.list():
            if seg > write_seg:
                break  # created by a writer killed while rotating: nothing acknowledged there
            self._read_segment(seg, 0, write_end if seg == write_seg else None)
        self._cursor = (write_seg, write_end)

    def _catch_up_locked(self) -> None:
        """Apply the records other writers appended since this process last looked."""
        if self._state.generation != self._generation:
            self._full_scan_locked()
            return
        target = self._state.write_position()
        while self._cursor < target:
            seg, offset = self._cursor
            if seg < target[0]:
                self._read_segment(seg, offset, None)
                self._cursor = (seg + 1, 0)
            else:
                self._read_segment(seg, offset, target[1])
                self._cursor = target

    def _read_segment(self, seg: int, offset: int, stop: int | None) -> None:
        path = self._segments.path(seg)
        if seg == self._seg_no and self._seg_fd >= 0 and stop is not None:
            # Catching up on the segment we write to: read through our open descriptor.
            buf = os.pread(self._seg_fd, stop - offset, offset)
        else:
            buf = read_range(path, offset, stop)
        if stop is not None and offset + len(buf) < stop:
            raise WALCorruptionError(
                path, offset + len(buf), f"segment is shorter than its recorded end {stop}"
            )
        result = scan(buf)
        if result.problem is not None:
            raise WALCorruptionError(path, offset + result.valid_end, result.problem)
        for record in result.records:
            self._apply_decoded(path, offset, record)

    def _apply_decoded(self, path: Path, base: int, record: DecodedRecord) -> None:
        try:
            self._index.apply(record.payload)
        except (KeyError, ValueError, TypeError, WALError) as exc:
            raise WALCorruptionError(
                path, base + record.offset, f"record does not describe a WAL change: {exc}"
            ) from exc

    def _ensure_segment_fd(self, seg: int) -> None:
        if seg == self._seg_no and self._seg_fd >= 0:
            return
        fd = os.open(self._segments.path(seg), os.O_RDWR | os.O_CLOEXEC)
        if self._seg_fd >= 0:
            os.close(self._seg_fd)
        self._seg_fd, self._seg_no = fd, seg

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosedError(f"WAL {self.directory} is closed")
