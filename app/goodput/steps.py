"""A job's step history read as progress: which reports were new work, and how long a step takes.

The input is the trainer's recorded step changes ``(at, step)`` in time order
(``app.ingest.step_progress``). The job's *high-water mark* is the highest step ever reported; a
report above it completed ``step - mark`` new steps at ``at``. A report at or below the mark is
not progress: after a restore from an older checkpoint, the steps up to the mark are trained
again (redone work), and only the first step above it is new.
"""

from __future__ import annotations

import statistics
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from app.goodput.intervals import Interval


@dataclass(slots=True, frozen=True)
class StepPoint:
    """The trainer reported ``step`` completed steps at ``at`` (epoch seconds)."""

    at: float
    step: int


@dataclass(slots=True, frozen=True)
class Completion:
    """New work: the high-water mark rose to ``step`` at ``at`` (by ``new`` steps)."""

    at: float
    step: int
    new: int


class StepHistory:
    """Queries over one job's step points (sorted by time on construction)."""

    def __init__(self, points: Sequence[StepPoint]) -> None:
        self.points = sorted(points, key=lambda p: p.at)
        self.completions: list[Completion] = []
        mark: int | None = None
        for p in self.points:
            if mark is not None and p.step > mark:
                self.completions.append(Completion(p.at, p.step, p.step - mark))
            mark = p.step if mark is None else max(mark, p.step)
        self._times = [c.at for c in self.completions]

    @property
    def first_at(self) -> float | None:
        return self.points[0].at if self.points else None

    def mark_at(self, t: float) -> int | None:
        """The high-water mark at ``t`` (None before the first report)."""
        mark = None
        for p in self.points:
            if p.at > t:
                break
            mark = p.step if mark is None else max(mark, p.step)
        return mark

    def last_completion_at(self, t: float) -> float | None:
        """When new work was last completed at or before ``t``."""
        i = bisect_right(self._times, t)
        return self._times[i - 1] if i else None

    def first_completion_after(self, t: float) -> Completion | None:
        """The first new work completed strictly after ``t``."""
        i = bisect_right(self._times, t)
        return self.completions[i] if i < len(self.completions) else None

    def new_steps_between(self, start: float, end: float) -> int:
        """Steps of new work completed in ``(start, end]``."""
        return sum(c.new for c in self.completions if start < c.at <= end)

    def lowest_step_between(self, start: float, end: float) -> int | None:
        """The lowest step reported in ``(start, end]`` (a restore shows here)."""
        steps = [p.step for p in self.points if start < p.at <= end]
        return min(steps) if steps else None

    def typical_step_seconds(self, disturbed: Sequence[Interval] = ()) -> float | None:
        """Median seconds per new step between consecutive completions, leaving out the gaps
        that overlap a ``disturbed`` interval (a fault's time is not a step's time)."""
        per_step: list[float] = []
        for a, b in zip(self.completions, self.completions[1:], strict=False):
            if any(iv.start < b.at and a.at < iv.end for iv in disturbed):
                continue
            per_step.append((b.at - a.at) / b.new)
        return statistics.median(per_step) if per_step else None
