"""Interval arithmetic on the time axis (epoch seconds): the ledger's only geometry.

Overlapping incidents must not be counted twice, a window clips what it shows, and a waiting
period is carved out of a recovery: all three are unions, intersections and differences of
half-open intervals ``[start, end)``. Lists returned here are sorted and disjoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True, order=True)
class Interval:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def clip(self, lo: float, hi: float) -> Interval | None:
        """The part of this interval inside ``[lo, hi)``; None when nothing is."""
        start, end = max(self.start, lo), min(self.end, hi)
        return Interval(start, end) if end > start else None


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly what ``intervals`` cover."""
    out: list[Interval] = []
    for iv in sorted(i for i in intervals if i.end > i.start):
        if out and iv.start <= out[-1].end:
            if iv.end > out[-1].end:
                out[-1] = Interval(out[-1].start, iv.end)
        else:
            out.append(iv)
    return out


def measure(intervals: Iterable[Interval]) -> float:
    """Seconds covered, each second once however many intervals cover it."""
    return sum(iv.seconds for iv in union(intervals))


def clip_all(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    """``intervals`` ∩ ``[lo, hi)``, as a union."""
    return union(c for iv in intervals if (c := iv.clip(lo, hi)) is not None)


def subtract(base: Interval, holes: Iterable[Interval]) -> list[Interval]:
    """``base`` minus every hole, sorted and disjoint."""
    out: list[Interval] = []
    cursor = base.start
    for hole in union(holes):
        if hole.end <= cursor or hole.start >= base.end:
            continue
        if hole.start > cursor:
            out.append(Interval(cursor, hole.start))
        cursor = max(cursor, hole.end)
    if cursor < base.end:
        out.append(Interval(cursor, base.end))
    return out


def overlap(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Seconds covered by both ``a`` and ``b``."""
    ua, ub = union(a), union(b)
    total, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i].start, ub[j].start), min(ua[i].end, ub[j].end)
        if hi > lo:
            total += hi - lo
        if ua[i].end < ub[j].end:
            i += 1
        else:
            j += 1
    return total
