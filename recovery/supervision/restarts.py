"""How many restarts a launcher may still make, and how long to wait before the next one.

A process that keeps dying right after it starts (a bad argument, a missing file, a poisoned
checkpoint) must not be restarted in a tight loop forever: each restart spends one unit of a
budget shared by the whole launch, and a process that died within ``stable_seconds`` of its
start waits ``backoff`` seconds before its next start, doubled for each such quick failure in a
row, up to ``backoff_max``. A process that ran longer than ``stable_seconds`` restarts at once:
it was healthy, and every second waited is lost training time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class RestartBudgetError(ValueError):
    """A restart budget setting was refused; the message names it."""


@dataclass
class RestartBudget:
    """The launch's restart budget and backoff (see the module docstring)."""

    max_restarts: int = 10
    backoff: float = 1.0
    backoff_max: float = 30.0
    stable_seconds: float = 60.0
    used: int = 0

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or (self.max_restarts < 0)
        ):
            raise RestartBudgetError(f"max_restarts must be an int >= 0, got {self.max_restarts!r}")
        for name in ("backoff", "backoff_max", "stable_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise RestartBudgetError(f"{name} must be a number >= 0, got {value!r}")
        if self.backoff_max < self.backoff:
            raise RestartBudgetError(
                f"backoff_max ({self.backoff_max:g}) must be >= backoff ({self.backoff:g})"
            )

    @property
    def left(self) -> int:
        """Restarts still allowed."""
        return max(0, self.max_restarts - self.used)

    def spend(self, count: int = 1) -> bool:
        """Take ``count`` restarts from the budget; False (nothing taken) if it cannot pay."""
        if count > self.left:
            return False
        self.used += count
        return True

    def delay(self, quick_failures: int) -> float:
        """Seconds to wait before restarting a process that died quickly ``quick_failures``
        times in a row (0: it ran long enough, restart at once)."""
        if quick_failures <= 0 or self.backoff == 0:
            return 0.0
        return float(min(self.backoff_max, self.backoff * 2 ** (quick_failures - 1)))
