"""Group commit: one fdatasync makes the records of many threads and processes durable.

Every appender, after writing its record, needs the durable mark (in the shared state) to
reach the end of its record. Inside a process, one thread at a time acts for the process
(the *process leader*); the others sleep on a condition variable and are woken when it is
done. Across processes, the sync lock elects the one leader that runs ``fdatasync``: it reads
the current write position (everything before it is whole records, written by anyone),
fsyncs, then raises the shared durable mark to that position. A process leader that finds the
sync lock taken sleeps on a shared counter (a futex) that every release of the sync lock bumps,
then re-reads the durable mark (a lock-free read of one word), until another process's fsync
covers its record or the lock is free.

Gathering: every call waits for its own record, so a thread has at most one record waiting.
A leader that starts its fsync the moment it gets the sync lock covers only the records
written while the previous fsync ran, and the writers fall into two alternating half-batches.
So before it reads the write position, the leader waits until every write call in flight
(counted per handle in the shared state) has written its record, for at most the mean time
of one fdatasync: the batch then holds everybody who is appending, and a lone writer (nothing
else in flight) never waits.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from recovery._process_lock import ProcessLock
from recovery.wal._errors import WALLockTimeout
from recovery.wal._locks import SharedState

Position = tuple[int, int]
#: What a leader syncs: the write position, the records written before it, and a duplicated
#: descriptor of its segment (the leader closes it).
Snapshot = tuple[Position, int, int]
# Longest sleep before looking at the durable mark again even without a wake-up (a leader
# killed by SIGKILL releases the sync lock without waking anybody).
_WAKE_CHECK_S = 0.005
# Upper bound of the wait for the calls in flight, whatever a sync costs on this disk.
_MAX_GATHER_S = 0.002


class GroupCommit:
    """Makes positions of one log durable, sharing fsyncs between threads and processes.

    ``snapshot(timeout)`` must take the append lock briefly and return a :data:`Snapshot`.
    """

    def __init__(
        self,
        state: SharedState,
        sync_lock: ProcessLock,
        snapshot: Callable[[float], Snapshot],
    ) -> None:
        self._state = state
        self._sync_lock = sync_lock
        self._snapshot = snapshot
        self._cond = threading.Condition()
        self._leader_active = False
        self._known_durable: Position = (0, 0)
        #: fdatasync calls this process made for the log, and the seconds they took.
        self.fsyncs = 0
        self.sync_seconds = 0.0

    def try_lead_now(self) -> bool:
        """Claim leadership without waiting (called right after writing, append lock held)."""
        with self._cond:
            if self._leader_active or not self._sync_lock.try_acquire():
                return False
            self._leader_active = True
            return True

    def lead_failed(self) -> None:
        """Give up a leadership claimed by :meth:`try_lead_now` before any fsync."""
        self._sync_lock.release()
        self._finish(None)

    def lead(self, written: Snapshot, deadline: float) -> None:
        """After :meth:`try_lead_now` succeeded: gather, fsync, publish the durable mark.

        ``written`` is the snapshot taken right after this thread's own record.
        """
        achieved: Position | None = None
        try:
            achieved = self._sync_locked(written, deadline)
        finally:
            self._sync_lock.release()
            self._finish(achieved)

    def wait(self, position: Position, deadline: float) -> None:
        """Return once ``position`` is durable; raise :class:`WALLockTimeout` at ``deadline``."""
        while True:
            with self._cond:
                while True:
                    if self._known_durable >= position:
                        return
                    if not self._leader_active:
                        self._leader_active = True
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise WALLockTimeout("timed out waiting for the WAL to become durable")
                    self._cond.wait(remaining)
            achieved: Position | None = None
            try:
                achieved = self._sync_across_processes(position, deadline)
            finally:
                self._finish(achieved)

    def _sync_locked(self, snapshot: Snapshot | None, deadline: float) -> Position:
        """Gather, then fdatasync everything written so far (sync lock held); the position."""
        try:
            if self._gather(deadline) or snapshot is None:
                if snapshot is not None:
                    os.close(snapshot[2])
                    snapshot = None
                snapshot = self._snapshot(max(deadline - time.monotonic(), 0.001))
            target, records, fd = snapshot
            start = time.perf_counter()
            os.fdatasync(fd)
            elapsed = time.perf_counter() - start
        finally:
            if snapshot is not None:
                os.close(snapshot[2])
        self.fsyncs += 1
        self.sync_seconds += elapsed
        self._state.advance_durable(*target)
        self._state.note_sync(records, elapsed)
        return target

    def count_sync(self, seconds: float) -> None:
        """Count a sync made by a write itself (``RWF_DSYNC``) in this process's figures."""
        self.fsyncs += 1
        self.sync_seconds += seconds

    def _gather(self, deadline: float) -> bool:
        """Wait until every write call in flight has written its record (or the bound is up);
        True if it waited, so that the write position must be read again."""
        state = self._state
        if state.batch_complete():
            return False
        _, sync_s = state.sync_record()
        stop = min(time.monotonic() + min(sync_s or _MAX_GATHER_S, _MAX_GATHER_S), deadline)
        counter = state.gather_done
        state.gathering = True  # from now on, whoever completes the batch wakes us
        try:
            while True:
                seen = counter.value()
                if state.batch_complete():
                    return True
                now = time.monotonic()
                if now >= stop:
                    state.free_dead_slots()  # a killed writer's call never finishes
                    return True
                counter.wait_while(seen, stop - now)
        finally:
            state.gathering = False

    def _finish(self, achieved: Position | None) -> None:
        with self._cond:
            self._leader_active = False
            if achieved is not None and achieved > self._known_durable:
                self._known_durable = achieved
            self._cond.notify_all()

    def _sync_across_processes(self, position: Position, deadline: float) -> Position:
        while True:
            seen = self._state.sync_released.value()
            durable = self._state.durable_position()
            if durable >= position:
                return durable  # another process's fsync covered our record
            if self._sync_lock.try_acquire():
                try:
                    durable = self._state.durable_position()
                    if durable >= position:
                        return durable
                    return self._sync_locked(None, deadline)
                finally:
                    self._sync_lock.release()
            now = time.monotonic()
            if now >= deadline:
                raise WALLockTimeout("timed out waiting for another process's WAL fsync")
            self._state.sync_released.wait_while(seen, min(deadline - now, _WAKE_CHECK_S))
