"""Bounded in-memory window of recent samples per series.

This is the hot store the policy engine reads every tick. A series is identified by
(node, metric name, sorted labels). Each series keeps at most ``max_points`` samples and nothing
older than ``window_seconds`` (relative to the newest sample), so memory stays bounded whatever
the agents send. It is thread-safe: ingest appends from request handlers while the policy tick
and the rollup job read. The questions the tick asks of every series are answered here, as
samples arrive (``watch``, ``app.series.watch``).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import threading
import weakref
from collections import deque
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from app.series.watch import CHANGED, PASSING, Handler, SeriesWatch

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class SeriesKey:
    node: str
    name: str
    labels: Labels = ()
    # Computed once: every ingested sample looks its series up by key, and hashing the nested
    # label tuple each time was a measurable share of the ingest hot path.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.node, self.name, self.labels)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, node: str, name: str, labels: Mapping[str, str] | None = None) -> SeriesKey:
        return cls(node, name, tuple(sorted((labels or {}).items())))

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


class Point(NamedTuple):
    """One sample of a series. A named tuple, not a dataclass: readers build hundreds of
    thousands per policy tick or rollup pass, and a tuple is several times cheaper to make."""

    ts: float
    value: float


#: A series' samples, oldest first: ``(ts, value)`` pairs (read-only for anyone but the store).
Buffer = Sequence[tuple[float, float]]

_make_point = functools.partial(tuple.__new__, Point)  # Point from a (ts, value) pair, in C


def _point_ts(point: tuple[float, float]) -> float:
    return point[0]


class _Series:
    __slots__ = ("points",)

    def __init__(self, max_points: int) -> None:
        self.points: deque[tuple[float, float]] = deque(maxlen=max_points)


class SeriesStore:
    """Per-series ring buffers with time-based trimming."""

    def __init__(self, *, window_seconds: float = 900.0, max_points: int = 1200) -> None:
        if window_seconds <= 0 or max_points <= 0:
            raise ValueError("window_seconds and max_points must be positive")
        self.window_seconds = window_seconds
        self.max_points = max_points
        self._series: dict[SeriesKey, _Series] = {}
        self._lock = threading.Lock()
        # Counts every series created or dropped: a reader that indexes the buffers (the
        # policy's LatestIndex) knows from it when its index is out of date, and only then.
        self.layout = 0
        # The registered watches (held weakly) and, per watched name, what extend does with a
        # sample of it (SeriesWatch.handlers): rebuilt when a watch is added or collected.
        self._watches: weakref.WeakSet[SeriesWatch] = weakref.WeakSet()
        self._handlers: dict[str, list[Handler]] = {}
        self._handlers_stale = False
        # Told which series were dropped, after the lock is released (the per-node quotas'
        # accounting, app/ingest/quotas.py).
        self._forget_listeners: list[Callable[[list[SeriesKey]], None]] = []

    def on_forget(self, listener: Callable[[list[SeriesKey]], None]) -> None:
        """Call ``listener`` with the series every drop forgets (outside the store's lock)."""
        self._forget_listeners.append(listener)

    def watch(self, watch: SeriesWatch) -> SeriesWatch:
        """Register ``watch``: answered from the series present now, then kept up to date by
        every extend (see ``app.series.watch``). Held weakly: drop the watch to stop it."""
        with self._lock:
            watch._lock = self._lock  # noqa: SLF001 - the watch reads its answers under it
            watch.start(self._series)
            self._watches.add(watch)
            weakref.finalize(watch, self._watch_gone)
            self._handlers_stale = True
        return watch

    def _watch_gone(self) -> None:
        # Called by the collector at any moment: only flag it, extend rebuilds under its lock.
        self._handlers_stale = True

    def _current_handlers(self) -> dict[str, list[Handler]]:
        if self._handlers_stale:
            self._handlers_stale = False
            merged: dict[str, list[Handler]] = {}
            for w in list(self._watches):
                for name, handlers in w.handlers().items():
                    merged.setdefault(name, []).extend(handlers)
            self._handlers = merged
        return self._handlers

    def append(self, key: SeriesKey, ts: float, value: float) -> None:
        self.extend([(key, ts, value)])

    def extend(self, samples: Iterable[tuple[SeriesKey, float, float]]) -> int:
        """Add samples; returns how many were stored. Out-of-order samples are kept in order."""
        n = 0
        all_series = self._series
        window = self.window_seconds
        with self._lock:
            watched = self._current_handlers()
            for key, ts, value in samples:
                series = all_series.get(key)
                if series is None:
                    series = all_series[key] = _Series(self.max_points)
                    self.layout += 1
                pts = series.points
                late = pts and ts < pts[-1][0]
                handlers = watched.get(key.name) if watched else None
                if handlers is not None and not late:
                    # the sample becomes the newest: the watches' answers follow it (inline, a
                    # function call per sample would cost ingest more than the checks)
                    for kind, found, compare, bound, healthy in handlers:
                        if kind == PASSING:
                            if compare(value, bound):  # type: ignore[misc]
                                found[key] = pts
                            elif key in found:
                                del found[key]
                        elif kind == CHANGED:
                            if not pts or pts[-1][1] != value:  # (not appended yet)
                                found[key] = pts
                        elif compare(value, bound):  # type: ignore[misc]  # RUN: breaches
                            found[key] = (ts, pts)
                        elif not value > healthy and key in found:  # a healthy one ends it
                            del found[key]
                if late:
                    # Rare (clock skew between agents' batches): insert in place to keep order.
                    # deque.insert is O(n) in C; rebuilding the window per sample in Python was
                    # slow enough for one node's skewed batch to stall ingest for everyone.
                    at = bisect.bisect_right(pts, ts, key=_point_ts)
                    if len(pts) == self.max_points:
                        if at == 0:
                            n += 1  # older than a full window: it would be trimmed at once
                            continue
                        pts.popleft()
                        at -= 1
                    pts.insert(at, (ts, value))
                else:
                    pts.append((ts, value))
                horizon = pts[-1][0] - window
                while pts and pts[0][0] < horizon:
                    pts.popleft()
                if late and handlers is not None:  # once trimmed: a sample older than the
                    for w in self._watches:  # window is gone as if it never came
                        w.reordered(key, pts)
                n += 1
        return n

    def keys(self, *, node: str | None = None, name: str | None = None) -> list[SeriesKey]:
        with self._lock:
            return [
                k
                for k in self._series
                if (node is None or k.node == node) and (name is None or k.name == name)
            ]

    def latest(self, key: SeriesKey) -> Point | None:
        with self._lock:
            series = self._series.get(key)
            if series is None or not series.points:
                return None
            ts, value = series.points[-1]
            return Point(ts, value)

    def buffers(self, names: Container[str]) -> tuple[int, list[tuple[SeriesKey, Buffer]]]:
        """Every series whose name is in ``names`` with its sample buffer (newest last), in the
        store's order, and the :attr:`layout` they belong to; one pass, under the lock.

        For a reader that reads the same series' newest samples again and again (the policy
        tick, the fleet heat map): it keeps the buffers and reads ``buffer[-1]`` in place,
        without the lock and without a key look-up per series (hashing 56,000 keys was two
        thirds of reading them). That is safe while ``layout`` is unchanged: ``extend``
        appends and trims under the lock and never empties a buffer, and a dropped series'
        buffer only stops receiving samples (``layout`` then moves, and the reader asks again).
        """
        with self._lock:
            found: list[tuple[SeriesKey, Buffer]] = [
                (k, s.points) for k, s in self._series.items() if k.name in names
            ]
            return self.layout, found

    def since(self, key: SeriesKey, since_ts: float) -> list[Point]:
        """Points with ``ts >= since_ts``, oldest first."""
        return list(map(_make_point, self.between(key, since_ts)))

    def between(
        self, key: SeriesKey, start: float, end: float | None = None
    ) -> list[tuple[float, float]]:
        """Raw ``(ts, value)`` pairs with ``start <= ts < end`` (no end: up to the newest).

        The window is kept sorted, so both ends are found by bisection and the slice is copied
        in C; aggregations over many series (rollups) read this rather than ``since``.
        """
        with self._lock:
            series = self._series.get(key)
            if series is None:
                return []
            pts = series.points
            lo = bisect.bisect_left(pts, start, key=_point_ts)
            hi = len(pts) if end is None else bisect.bisect_left(pts, end, lo=lo, key=_point_ts)
            return list(itertools.islice(pts, lo, hi))

    def rate(self, key: SeriesKey, window_seconds: float, *, now: float) -> float | None:
        """Per-second increase of a counter over the last ``window_seconds`` (resets tolerated)."""
        pts = self.since(key, now - window_seconds)
        if len(pts) < 2:
            return None
        increase = 0.0
        for prev, cur in zip(pts, pts[1:], strict=False):
            delta = cur.value - prev.value
            increase += delta if delta >= 0 else cur.value  # counter reset: count from zero
        elapsed = pts[-1].ts - pts[0].ts
        return increase / elapsed if elapsed > 0 else None

    def items(self) -> Iterator[tuple[SeriesKey, Point]]:
        """Latest point of every series (a snapshot, safe to iterate while ingest continues)."""
        with self._lock:
            snapshot = [(k, s.points[-1]) for k, s in self._series.items() if s.points]
        for key, (ts, value) in snapshot:
            yield key, Point(ts, value)

    def drop_older_than(self, ts: float) -> int:
        """Forget series whose newest sample is older than ``ts``; returns how many were dropped."""
        with self._lock:
            stale = [k for k, s in self._series.items() if not s.points or s.points[-1][0] < ts]
            self._forget(stale)
        self._tell_forgotten(stale)
        return len(stale)

    def forget(self, keys: Iterable[SeriesKey]) -> int:
        """Drop these series (those that exist); returns how many were dropped."""
        with self._lock:
            present = [k for k in keys if k in self._series]
            self._forget(present)
        self._tell_forgotten(present)
        return len(present)

    def _tell_forgotten(self, keys: list[SeriesKey]) -> None:
        if keys:
            for listener in self._forget_listeners:
                listener(keys)

    def _forget(self, keys: list[SeriesKey]) -> None:
        watches = list(self._watches) if keys else []
        for k in keys:
            del self._series[k]
            for w in watches:
                w.forget(k)
        self.layout += len(keys)

    def __len__(self) -> int:
        with self._lock:
            return len(self._series)
