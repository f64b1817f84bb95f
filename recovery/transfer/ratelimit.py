"""A token-bucket cap on a host's egress, for where network namespaces and ``tc`` are unavailable.

Shared by every connection of one server, so it models one network interface: 8 peers pulling
from a capped source each get an eighth of its rate.
"""

from __future__ import annotations

import threading
import time

from recovery.transfer.errors import TransferConfigError

SLICE_BYTES = 256 << 10


class EgressLimiter:
    """Reserve send time for ``n`` bytes at ``bytes_per_s``; callers sleep until their slot."""

    def __init__(self, bytes_per_s: float) -> None:
        if not bytes_per_s > 0:
            raise TransferConfigError(f"bytes_per_s must be positive, got {bytes_per_s!r}")
        self.bytes_per_s = float(bytes_per_s)
        self._lock = threading.Lock()
        self._next_free = time.monotonic()

    def reserve(self, nbytes: int) -> float:
        """Book ``nbytes`` of link time; returns how long the caller must sleep first."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_free)
            self._next_free = start + nbytes / self.bytes_per_s
            return start - now

    def throttle(self, nbytes: int) -> None:
        """Block until ``nbytes`` may go out."""
        delay = self.reserve(nbytes)
        if delay > 0:
            time.sleep(delay)
