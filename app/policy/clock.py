"""Where the policy engine gets the time from.

Detectors never call ``time.time()`` themselves: they take ``now`` from a clock, so that a
recorded trace can be replayed faster than real time and a test can step time by hand.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch, as the engine should see them."""
        ...


class WallClock:
    """The real time; what the server uses."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (tests and trace replay).

    ``advance_to`` refuses to go backwards, because every detector assumes time is monotonic.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot advance a clock by a negative amount: {seconds}")
        with self._lock:
            self._now += seconds
            return self._now

    def advance_to(self, ts: float) -> float:
        with self._lock:
            if ts < self._now:
                raise ValueError(f"clock cannot go back from {self._now} to {ts}")
            self._now = float(ts)
            return self._now
