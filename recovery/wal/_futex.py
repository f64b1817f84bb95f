"""Cross-process sleep and wake-up on a 32-bit word of a shared mapping (Linux futex).

Waiting for another process (for its fsync, or for a lock it holds) by polling costs CPU and
adds latency on a busy machine; a futex lets the waiter sleep in the kernel until the other
process bumps the counter and wakes it, with a timeout. Where the futex system call is not
available (another OS or CPU), waiting falls back to short sleeps.
"""

from __future__ import annotations

import ctypes
import mmap
import platform
import sys
import time
from collections.abc import Callable
from typing import cast

from recovery.wal._errors import WALClosedError

_FUTEX_NUMBERS = {"x86_64": 202, "aarch64": 98}
_SYS_FUTEX = _FUTEX_NUMBERS.get(platform.machine(), 0) if sys.platform == "linux" else 0
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_WAKE_ALL = 0x7FFFFFFF
_FALLBACK_SLEEP_S = 0.0002


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall(loader: type[ctypes.CDLL]) -> Callable[..., int] | None:
    if not _SYS_FUTEX:
        return None
    try:
        function = loader(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    return cast("Callable[..., int]", function)


# A wait blocks, so it must let other threads run (CDLL releases the GIL around the call). A
# wake returns at once: calling it through PyDLL keeps the GIL, which spares a GIL hand-over
# (a context switch each way when another thread is waiting for it) on every lock release.
_syscall = _load_syscall(ctypes.CDLL)
_syscall_keep_gil = _load_syscall(ctypes.PyDLL)


class SharedCounter:
    """A counter in a ``MAP_SHARED`` mapping that other processes can sleep on.

    ``bump_and_wake`` must be called *after* the change the waiters look for (a released
    lock, a raised durable mark); a waiter reads :meth:`value` *before* checking for that
    change, then sleeps only while the counter still has that value, so no wake-up is lost.
    """

    def __init__(self, mapping: mmap.mmap, offset: int) -> None:
        self._word: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(mapping, offset)
        address = ctypes.c_void_p(ctypes.addressof(self._word))
        # Built once: ctypes argument objects cost more than the system call itself.
        self._wake_args = (
            ctypes.c_long(_SYS_FUTEX),
            address,
            ctypes.c_int(_FUTEX_WAKE),
            ctypes.c_int(_WAKE_ALL),
            None,
            None,
            ctypes.c_int(0),
        )
        self._wait_head = (ctypes.c_long(_SYS_FUTEX), address, ctypes.c_int(_FUTEX_WAIT))

    def _live_word(self) -> ctypes.c_uint32:
        word = self._word
        if word is None:
            # A lock or waiter outlived its log's close(): a bug in the caller's ordering, named
            # plainly instead of an AssertionError (or an AttributeError under -O).
            raise WALClosedError("the WAL's shared state was used after the log was closed")
        return word

    def value(self) -> int:
        """The current count."""
        return int(self._live_word().value)

    def bump_and_wake(self) -> None:
        """Increment the counter and wake every process sleeping on it."""
        word = self._live_word()
        # A lost increment between two concurrent bumpers is harmless: the value still differs
        # from what any sleeper read, and FUTEX_WAKE wakes sleepers whatever the value.
        word.value = (word.value + 1) & 0xFFFFFFFF
        if _syscall_keep_gil is not None:
            _syscall_keep_gil(*self._wake_args)

    def wait_while(self, expected: int, timeout: float) -> None:
        """Sleep until the counter differs from ``expected``, a wake-up, or ``timeout`` s."""
        if timeout <= 0:
            return
        if _syscall is None:
            time.sleep(min(timeout, _FALLBACK_SLEEP_S))
            return
        seconds = int(timeout)
        spec = _Timespec(seconds, int((timeout - seconds) * 1e9))
        # Returns 0 when woken, or -1 with EAGAIN (value already changed), ETIMEDOUT or EINTR:
        # in every case the caller re-checks what it is waiting for.
        _syscall(*self._wait_head, ctypes.c_uint32(expected), ctypes.byref(spec), None, 0)

    def detach(self) -> None:
        """Drop the view of the mapping so the mapping can be closed."""
        self._word = None
