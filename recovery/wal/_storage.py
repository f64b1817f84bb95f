"""The files side of a :class:`~recovery.wal.WriteAheadLog`: records written to the segments
under the append lock and made durable by group commit, segments preallocated and rotated, and
records read back into the entry index (at open, and to catch up with other writers).

:class:`LogFiles` is the base of ``WriteAheadLog``, which adds the public calls, their argument
checks and the handle's lifecycle (open, fork rule, close).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from recovery._process_lock import ProcessLock
from recovery.wal._combine import Call, CallQueue
from recovery.wal._errors import WALClosedError, WALCorruptionError, WALError
from recovery.wal._format import END_MARK, DecodedRecord, scan
from recovery.wal._groupcommit import GroupCommit
from recovery.wal._index import EntryIndex, WALEntry
from recovery.wal._locks import SharedState, read_boot_id
from recovery.wal._segments import SegmentDirectory, read_range

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


@dataclass(frozen=True, slots=True)
class _Written:
    """What a batch wrote: the end of its last record and, if this thread is to lead the
    sync, the leader's snapshot (position, records count, descriptor)."""

    end: tuple[int, int]
    leader: tuple[tuple[int, int], int, int] | None


class LogFiles:
    """Writing, syncing and reading the log's files; every method expects the caller to hold
    what its name says (``_locked``: the append lock) and the handle to be open."""

    directory: Path
    _sync: bool
    _segment_bytes: int
    _timeout: float
    _segments: SegmentDirectory
    _append_lock: ProcessLock
    _sync_lock: ProcessLock
    _closed: bool
    _pid: int
    _index: EntryIndex
    _cursor: tuple[int, int]
    _generation: int
    _seg_no: int
    _seg_fd: int
    _records_written: int  # changed under the append lock
    _slot: int | None  # this handle's slot in the shared state (write calls in flight)
    _calls: CallQueue
    _state: SharedState
    _group: GroupCommit

    # ------------------------------------------------------------------ writing

    def _write_and_wait(
        self, record: bytes, prepare: Callable[[], tuple[bytes | None, list[WALEntry]]]
    ) -> list[WALEntry]:
        """Write one record and return once it is durable.

        ``prepare`` runs under the append lock against an up-to-date index: it raises to refuse
        the change, or returns the record to write (``record``, a smaller one, or None when
        nothing changes) and what the entries become. The record may be written by another
        thread of this process together with its own (:mod:`recovery.wal._combine`).
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
