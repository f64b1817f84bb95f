"""Two-level failure detection from heartbeats: silent → suspected → confirmed failed.

A slow participant and a dead one look the same for a while, so silence first only makes a
participant *suspected* (default 15 s); it is *confirmed* failed only after a further observation
window (default 60 s) without a heartbeat. A suspected participant that beats again is cleared
without any action. The clock is injected so the logic is tested without sleeping.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from recovery.checkpoint.errors import CheckpointInputError


class Health(enum.Enum):
    """Liveness of one participant as the coordinator sees it."""

    ALIVE = "alive"
    SUSPECTED = "suspected"
    FAILED = "failed"


@dataclass(frozen=True)
class HealthChange:
    """One transition reported by :meth:`FailureDetector.evaluate` or :meth:`beat`."""

    name: str
    old: Health
    new: Health
    silent_for: float


class FailureDetector:
    """Tracks the last heartbeat of each participant and classifies silence.

    ``suspect_after``: seconds of silence before SUSPECTED; ``confirm_after``: further seconds
    of silence before FAILED. A FAILED participant that beats again becomes ALIVE (it was
    restarted); the transition is reported so the caller can decide what that means.
    """

    def __init__(
        self,
        *,
        suspect_after: float = 15.0,
        confirm_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not suspect_after > 0:
            raise CheckpointInputError(f"suspect_after must be > 0 seconds, got {suspect_after!r}")
        if not confirm_after > 0:
            raise CheckpointInputError(f"confirm_after must be > 0 seconds, got {confirm_after!r}")
        self.suspect_after = suspect_after
        self.confirm_after = confirm_after
        self._clock = clock
        self._last: dict[str, float] = {}
        self._health: dict[str, Health] = {}
        self._lock = threading.Lock()

    def beat(self, name: str) -> HealthChange | None:
        """Record a heartbeat; returns the change when a suspected or failed participant returns."""
        now = self._clock()
        with self._lock:
            old = self._health.get(name)
            silent = now - self._last.get(name, now)
            self._last[name] = now
            self._health[name] = Health.ALIVE
        if old is not None and old is not Health.ALIVE:
            return HealthChange(name, old, Health.ALIVE, silent)
        return None

    def evaluate(self) -> list[HealthChange]:
        """Re-classify everyone against the clock; returns the transitions since last time."""
        now = self._clock()
        changes = []
        with self._lock:
            for name, last in self._last.items():
                silent = now - last
                if silent >= self.suspect_after + self.confirm_after:
                    new = Health.FAILED
                elif silent >= self.suspect_after:
                    new = Health.SUSPECTED
                else:
                    new = Health.ALIVE
                old = self._health[name]
                # Silence only escalates; coming back is reported by beat().
                if new != old and not (new is Health.ALIVE or old is Health.FAILED):
                    self._health[name] = new
                    changes.append(HealthChange(name, old, new, silent))
        return changes

    def health(self, name: str) -> Health | None:
        """Current classification (None: never heard of)."""
        with self._lock:
            return self._health.get(name)

    def silent_for(self, name: str) -> float | None:
        """Seconds since the last heartbeat of ``name`` (None: never heard of)."""
        with self._lock:
            last = self._last.get(name)
        return None if last is None else self._clock() - last

    def forget(self, name: str) -> None:
        """Stop tracking ``name`` (it left the job on purpose)."""
        with self._lock:
            self._last.pop(name, None)
            self._health.pop(name, None)
