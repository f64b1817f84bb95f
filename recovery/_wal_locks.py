"""Cross-thread, cross-process locks and the shared sync state of the write-ahead log.

Two locks coordinate writers. The *append* lock serializes writing records (it is held for a
few microseconds per record). The *sync* lock elects the one writer that runs ``fdatasync``
for everybody: it is held for the length of one fsync, while the others keep appending. Which
bytes are known durable is kept in a small file mapped into every process (``wal.state``), so a
writer that waited for the sync lock can see that the previous leader's fsync already covered
its record and return without an fsync of its own (group commit).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import threading
import time
from pathlib import Path

from recovery._wal_errors import WALLockTimeout

# Back-off while polling a contended flock: short at first because the append lock is held for
# microseconds, capped so a waiter notices a released sync lock within about a millisecond.
_POLL_FIRST_S = 0.00005
_POLL_MAX_S = 0.001


class ProcessLock:
    """A lock that excludes other threads of this process and other processes.

    A ``threading.Lock`` orders the threads of one process (flock does not: all threads share
    the one open file description), and ``flock`` on a file orders processes. ``flock`` has no
    timeout, so a contended lock is polled with ``LOCK_NB`` until the deadline.
    """

    def __init__(self, path: Path, *, timeout_error: type[Exception] = WALLockTimeout) -> None:
        self.path = path
        self._timeout_error = timeout_error
        self._mutex = threading.Lock()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def acquire(self, timeout: float) -> None:
        """Take the lock, or raise :class:`WALLockTimeout` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        if not self._mutex.acquire(timeout=max(timeout, 0.0)):
            raise self._timeout_error(
                f"timed out after {timeout:.3f}s waiting for {self.path} (thread)"
            )
        delay = _POLL_FIRST_S
        while True:
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

    def close(self) -> None:
        """Close the lock file; the lock must not be held."""
        os.close(self._fd)


def read_boot_id() -> bytes:
    """16 bytes naming the current boot of this machine (zeros where Linux's id is missing).

    The shared state describes page-cache contents; after a reboot it is meaningless, and the
    boot id lets the first opener notice that and rebuild it from a scan.
    """
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return bytes.fromhex(text.replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


_STATE_MAGIC = b"RLGWAL01"
# magic, boot id, generation, write segment, write end, durable segment, durable end
_STATE = struct.Struct("<8s16sQQQQQ")
STATE_FILE_BYTES = 4096


class SharedState:
    """The log's shared positions, in a file mapped by every process that has the log open.

    * ``write_seg``/``write_end``: where the next record goes; changed only under the append
      lock, after a record was completely written, so every byte before it is whole records.
    * ``durable_seg``/``durable_end``: everything up to here is known to be on stable storage;
      changed only under the sync lock, and only after an fsync returned.
    * ``generation``: bumped when segments are replaced (compaction, repair), telling other
      processes to re-read the log from scratch.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if os.fstat(self._fd).st_size < STATE_FILE_BYTES:
            os.ftruncate(self._fd, STATE_FILE_BYTES)
        self._map = mmap.mmap(self._fd, STATE_FILE_BYTES, mmap.MAP_SHARED)

    def _unpack(self) -> tuple[bytes, bytes, int, int, int, int, int]:
        values: tuple[bytes, bytes, int, int, int, int, int] = _STATE.unpack_from(self._map, 0)
        return values

    def is_valid_for(self, boot_id: bytes) -> bool:
        """True if the state was written during this boot (else it must be rebuilt)."""
        magic, boot, *_ = self._unpack()
        return magic == _STATE_MAGIC and boot == boot_id

    def reset(self, boot_id: bytes, generation: int, seg: int, end: int) -> None:
        """Rewrite the whole state: next write and durable both at ``(seg, end)``."""
        _STATE.pack_into(self._map, 0, _STATE_MAGIC, boot_id, generation, seg, end, seg, end)

    @property
    def generation(self) -> int:
        """Counter bumped whenever segment files are replaced."""
        return self._unpack()[2]

    def write_position(self) -> tuple[int, int]:
        """(segment, offset) where the next record will be written."""
        values = self._unpack()
        return values[3], values[4]

    def set_write_position(self, seg: int, end: int) -> None:
        """Record the next write position; caller holds the append lock."""
        struct.pack_into("<QQ", self._map, 32, seg, end)

    def durable_position(self) -> tuple[int, int]:
        """(segment, offset) up to which records are known durable."""
        values = self._unpack()
        return values[5], values[6]

    def advance_durable(self, seg: int, end: int) -> None:
        """Move the durable mark forward (never back); caller holds the sync lock."""
        if (seg, end) > self.durable_position():
            struct.pack_into("<QQ", self._map, 48, seg, end)

    def bump_generation(self) -> int:
        """Increment and return the generation; caller holds both locks."""
        generation = self.generation + 1
        struct.pack_into("<Q", self._map, 24, generation)
        return generation

    def close(self) -> None:
        """Unmap and close the state file."""
        self._map.close()
        os.close(self._fd)
