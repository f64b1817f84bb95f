"""Write combining: the threads of one process hand their records to one writer at a time.

With several appender threads in a process, each taking the append lock, writing and syncing
on its own costs a few system calls per record, and in CPython every one of them can hand the
GIL to another thread (a context switch each way). Instead, a call queues its record; the
first caller with nobody writing becomes the *combiner*: it takes every queued record, writes
them all under one hold of the append lock (one ``pwrite`` for those that fit the segment),
hands the combiner role to the next queued call, and then waits until its batch is durable
(the group commit of :mod:`recovery.wal._groupcommit`) before waking the batch's callers. A
caller thus sleeps once and is woken once; a single-threaded caller is its own combiner and
never waits for anybody.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from recovery.wal._errors import WALLockTimeout

Position = tuple[int, int]

_QUEUED, _TAKEN, _DONE = 0, 1, 2


class Call:
    """One append or status change on its way to the log.

    The batch writer sets ``result`` (what the caller gets back), ``error`` (what it raises)
    and ``position`` (the end of its record, None when no record was needed).
    """

    __slots__ = (
        "deadline",
        "error",
        "position",
        "prepare",
        "promoted",
        "record",
        "result",
        "state",
        "wakeup",
    )

    def __init__(self, record: bytes, prepare: Callable[[], Any], deadline: float) -> None:
        self.record = record
        self.prepare = prepare
        self.deadline = deadline
        self.state = _QUEUED
        self.promoted = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.position: Position | None = None
        # Only a call that has to wait gets one: held until the call is done or promoted,
        # its thread sleeps acquiring it.
        self.wakeup: threading.Lock | None = None


#: Writes a batch under the append lock (setting each call's result, error and position) and
#: returns what the durability step needs, or None if nothing was written.
WriteBatch = Callable[[list[Call], float], Any]
#: Makes what a batch wrote durable (lead a sync or wait for one); raises on failure.
MakeDurable = Callable[[Any, float], None]


class CallQueue:
    """Queue of one handle's write calls and the combiner role (see the module docstring).

    ``publish(n)`` is called (under the queue's lock) whenever the number of calls in
    :meth:`run` changes, so that sync leaders in other processes can see it.
    """

    def __init__(self, publish: Callable[[int], None], grace_s: float) -> None:
        self._lock = threading.Lock()
        # How long past its deadline a call taken into a batch waits for its combiner (whose
        # every wait is bounded by the batch's deadline) before giving up on it.
        self._grace_s = grace_s
        self._queue: deque[Call] = deque()
        self._combining = False
        self._in_flight = 0
        self._publish = publish

    def run(self, call: Call, write_batch: WriteBatch, make_durable: MakeDurable) -> Any:
        """Get ``call`` written and durable; return its result or raise its error."""
        with self._lock:
            self._in_flight += 1
            self._publish(self._in_flight)
            if self._combining:
                call.wakeup = threading.Lock()
                call.wakeup.acquire()
                self._queue.append(call)
                batch = None
            else:
                self._combining = True  # alone: write it at once, no queue
                call.state = _TAKEN
                batch = [call]
        try:
            if batch is None and self._wait_for_turn(call):
                batch = self._take_queue()
            if batch is not None:
                self._combine(call, batch, write_batch, make_durable)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._publish(self._in_flight)
        if call.error is not None:
            raise call.error
        return call.result

    def _wait_for_turn(self, call: Call) -> bool:
        """Sleep until the call is done (False) or promoted to combiner (True)."""
        wakeup = call.wakeup
        assert wakeup is not None
        while True:
            limit = call.deadline if call.state == _QUEUED else call.deadline + self._grace_s
            woken = wakeup.acquire(timeout=max(limit - time.monotonic(), 0.0))
            with self._lock:
                if call.state == _DONE:
                    return False
                if call.promoted:
                    return True
                # (The call may have been taken into a batch while it slept: a later limit.)
                limit = call.deadline if call.state == _QUEUED else call.deadline + self._grace_s
                if woken or time.monotonic() < limit:
                    continue
                if call.state == _QUEUED:  # nothing written: give up
                    self._queue.remove(call)
                    raise WALLockTimeout(
                        "timed out waiting for another thread of this process to write"
                    )
                # Taken into a batch whose combiner does not finish (its own waits are all
                # bounded, so it is stuck or gone): the record may or may not be written.
                call.state = _DONE
                raise WALLockTimeout(
                    "timed out waiting for the thread writing this call's batch; the record "
                    "may or may not have been written"
                )

    def _take_queue(self) -> list[Call]:
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            for queued in batch:
                queued.state = _TAKEN
        return batch

    def _combine(
        self, own: Call, batch: list[Call], write_batch: WriteBatch, make_durable: MakeDurable
    ) -> None:
        # Each call's own wait is bounded by its deadline; the batch by the latest of them,
        # so that a call promoted late does not make the others time out with it.
        deadline = max(c.deadline for c in batch) if len(batch) > 1 else own.deadline
        pending: Any = None
        try:
            pending = write_batch(batch, deadline)
        except BaseException as exc:
            # Every call not settled before the failure fails with it, including those whose
            # record was written: nobody made it durable.
            for c in batch:
                if c.error is None and (c.result is None or c.position is not None):
                    c.error = exc
                    c.position = None
        finally:
            self._hand_over()
        if len(batch) == 1:  # the common case of one thread: nobody else to wake
            try:
                if own.position is not None and pending is not None:
                    make_durable(pending, deadline)
            except BaseException as exc:
                own.error = exc
            return
        # Calls that wrote nothing (refused, or nothing to change) need no sync.
        self._finish([c for c in batch if c.position is None], own)
        waiting = [c for c in batch if c.position is not None]
        try:
            if waiting and pending is not None:
                make_durable(pending, deadline)
        except BaseException as exc:
            for c in waiting:
                c.error = exc
        finally:
            self._finish(waiting, own)

    def _finish(self, calls: list[Call], own: Call) -> None:
        with self._lock:
            for c in calls:
                c.state = _DONE
        for c in calls:
            if c is not own and c.wakeup is not None:
                c.wakeup.release()

    def _hand_over(self) -> None:
        """Pass the combiner role to the next queued call, or drop it if there is none."""
        with self._lock:
            if not self._queue:
                self._combining = False
                return
            successor = self._queue[0]
            successor.promoted = True
        assert successor.wakeup is not None
        successor.wakeup.release()
