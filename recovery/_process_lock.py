"""A lock that excludes other threads of this process and other processes, with a timeout.

One for every file the library shares between processes: the write-ahead log's append and
sync locks, the state log, the batch commit and the control file.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from recovery.errors import RecoveryTimeout

if TYPE_CHECKING:
    from recovery.wal._futex import SharedCounter

# Back-off while polling a contended flock: short at first because the append lock is held for
# microseconds, capped so a waiter notices a released sync lock within about a millisecond.
_POLL_FIRST_S = 0.00005
_POLL_MAX_S = 0.001
# Longest sleep on a counter before looking again (covers wake-ups that never come).
_WAKE_CHECK_S = 0.005


class ProcessLock:
    """A lock that excludes other threads of this process and other processes.

    A ``threading.Lock`` orders the threads of one process (flock does not: all threads share
    the one open file description), and ``flock`` on a file orders processes. ``flock`` has no
    timeout, so a contended lock is retried with ``LOCK_NB`` until the deadline; between tries
    the waiter sleeps on the lock's :class:`SharedCounter` when one is attached (every release
    bumps it and wakes the sleepers), else for a short, growing interval.
    """

    def __init__(self, path: Path, *, timeout_error: type[Exception] = RecoveryTimeout) -> None:
        self.path = path
        self._timeout_error = timeout_error
        self._mutex = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._released: SharedCounter | None = None

    def attach_counter(self, counter: SharedCounter | None) -> None:
        """Use ``counter`` (shared by all processes using this lock) to wait for releases."""
        self._released = counter

    def acquire(self, timeout: float) -> None:
        """Take the lock, or raise ``timeout_error`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=max(timeout, 0.0)):
            raise self._timeout_error(
                f"timed out after {timeout:.3f}s waiting for {self.path} (thread)"
            )
        delay = _POLL_FIRST_S
        while True:
            counter = self._released
            seen = counter.value() if counter is not None else 0
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except BaseException:
                self._mutex.release()
                raise
            now = time.monotonic()
            if now >= deadline:
                self._mutex.release()
                raise self._timeout_error(f"timed out after {timeout:.3f}s waiting for {self.path}")
            if counter is not None:
                # Bounded sleep: a holder killed by SIGKILL releases the flock without a wake-up.
                counter.wait_while(seen, min(deadline - now, _WAKE_CHECK_S))
            else:
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, _POLL_MAX_S)

    def try_acquire(self) -> bool:
        """Take the lock only if nobody holds it; never waits."""
        if not self._mutex.acquire(blocking=False):
            return False
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._mutex.release()
            return False
        except BaseException:
            self._mutex.release()
            raise
        return True

    def release(self) -> None:
        """Release the lock taken by :meth:`acquire` or a successful :meth:`try_acquire`."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._mutex.release()
            if self._released is not None:
                self._released.bump_and_wake()

    def close(self) -> None:
        """Close the lock file; the lock must not be held."""
        os.close(self._fd)
