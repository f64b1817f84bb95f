"""The :class:`WriteAheadLog` handle: the public calls, their argument checks, compaction and
the handle's lifecycle (open, the fork rule, close). Writing and reading the files is
:class:`recovery.wal._storage.LogFiles`, its base; see :mod:`recovery.wal` for the guarantees.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from recovery._closing import ClosesOnExit
from recovery._process_lock import ProcessLock
from recovery.fsio import fsync_file
from recovery.wal._args import (
    ChangeChecked,
    NewChecked,
    change_fields,
    check_change,
    check_new,
    encode_changes,
    item_list,
    new_entry_fields,
)
from recovery.wal._combine import CallQueue
from recovery.wal._data import (
    checksum_bytes,
    checksum_file,
    read_verified,
    unreferenced_data_files,
    write_data_file,
)
from recovery.wal._errors import (
    WALClosedError,
    WALDataError,
    WALError,
    WALForkedError,
    WALLockTimeout,
)
from recovery.wal._format import encode_record
from recovery.wal._groupcommit import GroupCommit
from recovery.wal._index import (
    EntryIndex,
    NewEntry,
    StatusChange,
    StepType,
    WALEntry,
    WALStatus,
    check_entry_id,
)
from recovery.wal._locks import MAX_SEGMENT_OFFSET, SharedState
from recovery.wal._segments import SegmentDirectory
from recovery.wal._storage import LogFiles

logger = logging.getLogger("rlguard.recovery.wal")

DEFAULT_SEGMENT_BYTES = 64 << 20
MIN_SEGMENT_BYTES = 1024
# Offsets must fit the shared durable mark; a record may start just below the limit.
MAX_SEGMENT_BYTES = MAX_SEGMENT_OFFSET - (2 << 20)

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


@dataclass(frozen=True)
class WALStats:
    """What this handle did since it was opened: records it wrote, the group-commit fsyncs it
    ran and the seconds those took.

    With group commit, ``fsyncs`` summed over all writers stays well below ``records``.
    """

    records: int
    fsyncs: int
    sync_seconds: float = 0.0


class WriteAheadLog(LogFiles, ClosesOnExit):
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
            self._append_lock = ProcessLock(
                self.directory / "append.lock", timeout_error=WALLockTimeout
            )
            self._sync_lock = ProcessLock(
                self.directory / "sync.lock", timeout_error=WALLockTimeout
            )
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
