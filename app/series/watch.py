"""Standing questions to the series store, answered as samples arrive.

The policy tick asks the same questions every second (a newest value past a threshold, a
counter that moved, a golden metric in a breach run). A :class:`SeriesWatch` registered with
the store once is kept up to date by ``SeriesStore.extend`` under the store's lock, one
comparison per sample of a watched name, so the tick reads only what there is to find instead of
passing over every series. A question is an operator from :mod:`operator` and a bound:

- ``passing``: the series whose newest value ``compare(value, bound)`` holds, with their buffers;
- ``changed``: the series that received a sample whose value differs from the newest one before
  it (NaN always differs) since the last :meth:`take`; a series new to the store, and every
  series present when the watch is created, count as changed;
- ``runs``: hysteresis runs, from a sample that ``breaches`` (``compare(value, warning)``) until
  a healthy one (not above ``healthy``); per series in a run, its newest breaching sample's time.

An out-of-order insert never changes a series' newest sample but may change its run: that
series' run is read again from its buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Compare = Callable[[float, float], bool]
Sample = tuple[float, float]


@dataclass(frozen=True, slots=True)
class RunRule:
    """A hysteresis run: entered by ``breaches(value, warning)``, left at ``value <= healthy``."""

    breaches: Compare
    warning: float
    healthy: float


# What the store keeps per watched name, in ``SeriesStore.extend``'s inner loop: (kind, the
# watch's dict for that name, compare, bound, healthy). Plain tuples: the loop unpacks them for
# every sample of a watched name.
PASSING, CHANGED, RUN = 0, 1, 2
Handler = tuple[int, dict[Any, Any], Compare | None, float, float]


class SeriesWatch:
    """The answers of one reader's questions (see the module docstring).

    Created by ``SeriesStore.watch``; its dicts are changed only under the store's lock, and
    :meth:`take` reads them under it. The store holds the watch weakly: a reader that is gone
    stops costing ingest anything.
    """

    def __init__(
        self,
        *,
        passing: Mapping[str, tuple[Compare, float]],
        changed: Sequence[str],
        runs: Mapping[str, RunRule],
    ) -> None:
        # per name: the series in the answer now (key → buffer; for runs key → (breach, buffer))
        self._passing: dict[str, tuple[Compare, float, dict[Any, Any]]] = {
            name: (cmp, bound, {}) for name, (cmp, bound) in passing.items()
        }
        self._changed: dict[str, dict[Any, Any]] = {name: {} for name in changed}
        self._runs: dict[str, tuple[RunRule, dict[Any, Any]]] = {
            name: (rule, {}) for name, rule in runs.items()
        }
        self.names = frozenset(self._passing) | frozenset(self._changed) | frozenset(self._runs)
        self._lock: Any = None  # the store's, set by SeriesStore.watch

    def handlers(self) -> dict[str, list[Handler]]:
        """Per name, what ``SeriesStore.extend`` does with each sample (see ``Handler``)."""
        out: dict[str, list[Handler]] = {}
        for name, (cmp, bound, found) in self._passing.items():
            out.setdefault(name, []).append((PASSING, found, cmp, bound, 0.0))
        for name, found in self._changed.items():
            out.setdefault(name, []).append((CHANGED, found, None, 0.0, 0.0))
        for name, (rule, found) in self._runs.items():
            out.setdefault(name, []).append((RUN, found, rule.breaches, rule.warning, rule.healthy))
        return out

    def start(self, series: Mapping[Any, Any]) -> None:
        """Answer every question from the buffers already in the store (under its lock)."""
        for key, s in series.items():
            pts = s.points
            if not pts or key.name not in self.names:
                continue
            entry = self._passing.get(key.name)
            if entry is not None and entry[0](pts[-1][1], entry[1]):
                entry[2][key] = pts
            found = self._changed.get(key.name)
            if found is not None:
                found[key] = pts
            run = self._runs.get(key.name)
            if run is not None:
                rescan_run(run[1], key, pts, run[0])

    def forget(self, key: Any) -> None:
        """A series dropped from the store (under its lock)."""
        for _, _, found in self._passing.values():
            found.pop(key, None)
        for found in self._changed.values():
            found.pop(key, None)
        for _, found in self._runs.values():
            found.pop(key, None)

    def reordered(self, key: Any, pts: Sequence[Sample]) -> None:
        """An out-of-order sample was inserted into ``key``'s buffer (under the store's lock)."""
        run = self._runs.get(key.name)
        if run is not None:
            rescan_run(run[1], key, pts, run[0])

    def take(self) -> Answers:
        """The answers now; the ``changed`` sets start again empty."""
        with self._lock:
            passing = {
                name: [(key, pts[-1]) for key, pts in found.items() if pts]
                for name, (_, _, found) in self._passing.items()
            }
            changed = {}
            for name, found in self._changed.items():
                changed[name] = [(key, pts[-1]) for key, pts in found.items() if pts]
                found.clear()
            runs = {
                name: [(key, breach, pts[-1]) for key, (breach, pts) in found.items() if pts]
                for name, (_, found) in self._runs.items()
            }
        return Answers(passing, changed, runs)


@dataclass(frozen=True, slots=True)
class Answers:
    """One :meth:`SeriesWatch.take`: per name, (key, newest sample) or, for runs, (key, ts of
    the newest breaching sample of its run, newest sample). In no particular order."""

    passing: dict[str, list[tuple[Any, Sample]]]
    changed: dict[str, list[tuple[Any, Sample]]]
    runs: dict[str, list[tuple[Any, float, Sample]]]


def rescan_run(found: dict[Any, Any], key: Any, pts: Sequence[Sample], rule: RunRule) -> None:
    """Read ``key``'s run again from its buffer, newest sample first: its newest breaching
    sample, unless a healthy one comes first. A run older than the buffer keeps the breach
    remembered for it (the buffer lost those samples, the run did not end)."""
    for ts, value in reversed(pts):
        if rule.breaches(value, rule.warning):
            found[key] = (ts, pts)
            return
        if not value > rule.healthy:
            found.pop(key, None)
            return
    old = found.get(key)
    if old is not None:
        found[key] = (old[0], pts)
