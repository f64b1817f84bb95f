"""The golden metrics' breach memory: what each series' newest samples say, kept across ticks.

A golden metric breaches only within an unhealthy run that holds a breaching sample (see
``golden_metrics``). Re-reading the look-back window of every series that sits between
``healthy`` and ``warning`` on every tick was most of the policy tick at cluster scale, and
almost always to find no breaching sample. So per series this keeps the timestamp of the newest
breaching sample since its last healthy one (None: none), derived from the samples seen so far
and updated from the samples appended since the previous tick only.

The claim "None" is exact for the look-back window; a timestamp may be stale (its sample
trimmed from the buffer since): the detector then re-reads the window, as it did on every
tick before, so a stale timestamp costs a read, never a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, count, repeat
from operator import gt, itemgetter
from typing import Any

from app.ingest.series_store import SeriesKey, SeriesStore
from app.policy.policy_file import GoldenMetricRule
from app.policy.world import World

Sample = tuple[float, float]
_buffer, _newest, _value = itemgetter(1), itemgetter(-1), itemgetter(1)
# (the series' buffer, the newest sample read from it, the newest breaching sample's ts)
_State = tuple[Sequence[Sample], Sample, float | None]


class BreachMemory:
    """Per series, the timestamp of the newest breaching sample of its current unhealthy run.

    What the state was derived from is checked on every read, so that nothing is assumed:

    - the buffer object (a series dropped and recreated has a new one: read again);
    - the newest sample, by identity: any append replaces it (a new tuple), so the same object
      means nothing was appended; the samples after it are the new ones;
    - out-of-order inserts (a backfilled sample lands before the newest, leaving it in place):
      the store counts them by series (``SeriesStore.reordered_since``); such a series is read
      again. A reorder that lands during a tick, after ``begin``, is seen at the next tick, as
      if it had come a moment later;
    - samples trimmed from the front only remove samples: a "None" stays true, a timestamp
      may go stale (see the module docstring);
    - the tick's time going back (a replay restarted, another store) forgets everything: "None"
      holds for look-back windows that only move forward.

    Only series judged on this tick are kept (``end``), so the memory follows the store's size.
    """

    def __init__(self) -> None:
        self._store: SeriesStore | None = None
        self._reorders = 0
        self._now = float("-inf")
        self._state: dict[SeriesKey, _State] = {}
        self._next: dict[SeriesKey, _State] = {}

    def begin(self, store: SeriesStore, now: float) -> None:
        if store is not self._store or now < self._now:
            self._store = store
            self._state = {}
            self._reorders = store.reordered_since(-1)[0]
        else:
            self._reorders, keys = store.reordered_since(self._reorders)
            for key in keys:
                self._state.pop(key, None)
        self._now = now
        self._next = {}

    def end(self) -> None:
        self._state, self._next = self._next, {}

    def candidates(
        self,
        world: World,
        rings: Sequence[tuple[SeriesKey, Sequence[Sample]]],
        rule: GoldenMetricRule,
        stale: float,
        oldest: float,
    ) -> list[SeriesKey]:
        """The series of ``rings`` (in their order) whose look-back window may hold a breach:
        above healthy now (the snapshot's filter was exactly this, NaN included: not above;
        above healthy is unhealthy), fresh (newest sample at most ``stale`` seconds old) and with
        a breaching sample in their current run at or after ``oldest``. For the others a full
        re-read of the window (``_judge``) finds no run that breaches."""
        healthy, now, store = rule.healthy, world.now, world.store
        state, keep = self._state, self._next
        out: list[SeriesKey] = []
        # Most series sit at or under healthy: those are left out in C, before the loop.
        buffers = list(map(_buffer, rings))
        try:
            newest_values = list(map(_value, map(_newest, buffers)))
        except IndexError:  # an empty buffer (the store never leaves one): judged as none
            newest_values = [b[-1][1] if b else healthy for b in buffers]
        above = compress(count(), map(gt, newest_values, repeat(healthy)))
        for i in above:
            key, points = rings[i]
            newest = points[-1]  # read again: ingest may have appended since
            if not newest[1] > healthy or now - newest[0] > stale:  # as Detector.fresh
                continue
            st = state.get(key)
            if st is not None and st[0] is points and st[1] is newest:
                keep[key] = st  # nothing appended since the last tick
                breach = st[2]
            elif st is not None and st[0] is points and _only_new(points, st[1], newest):
                # One sample since the last tick (agents report once a tick), judged without the
                # store's lock; it is above healthy (checked just above), so the run goes on.
                breach = newest[0] if rule.breaches(newest[1]) else st[2]
                keep[key] = (points, newest, breach)
            else:
                breach = self.newest_breach(store, key, points, st, rule, oldest)
            if breach is not None and breach >= oldest:
                out.append(key)
        return out

    def newest_breach(
        self,
        store: SeriesStore,
        key: SeriesKey,
        points: Sequence[Sample],
        st: _State | None,
        rule: GoldenMetricRule,
        oldest: float,
    ) -> float | None:
        """The ts of the newest breaching sample after the series' last healthy one, None when
        there is none at or after ``oldest`` (the look-back window's start), from ``st`` (the
        series' state at the last tick, if any) and the samples appended since."""
        with store._lock:  # noqa: SLF001 - iterating a buffer ingest appends to
            new = _after(points, st[1]) if st is not None and st[0] is points else None
            if st is None or new is None:
                breach = _scan_back(points, rule, oldest)
            else:
                breach = st[2]
                for ts, value in new:
                    if not rule.unhealthy(value):
                        breach = None  # a healthy sample ends the run
                    elif rule.breaches(value):
                        breach = ts
            last = points[-1]
        self._next[key] = (points, last, breach)
        return breach


def _only_new(points: Sequence[Sample], last: Sample, newest: Sample) -> bool:
    """Whether ``newest`` (read from the end of ``points``) is the one sample after ``last``.
    Safe without the lock: appends go to the end, so if more came after ``newest`` was read,
    the sample before the end is no longer ``last``; an out-of-order insert before ``newest``
    shows the same way (and the store counts it, see ``begin``)."""
    try:
        return points[-2] is last
    except IndexError:  # a one-sample buffer
        return False


def _after(points: Sequence[Sample], last: Any) -> list[Sample] | None:
    """The samples after ``last`` (found by identity), oldest first; None if it is gone."""
    new: list[Sample] = []
    for sample in reversed(points):
        if sample is last:
            new.reverse()
            return new
        new.append(sample)
    return None


def _scan_back(points: Sequence[Sample], rule: GoldenMetricRule, oldest: float) -> float | None:
    """The newest breaching sample's ts in the run that ends the buffer, from its newest
    sample back to the last healthy one or to ``oldest``: an older breach can never fall in a
    later tick's look-back window, whose start only moves forward."""
    for ts, value in reversed(points):
        if ts < oldest or not rule.unhealthy(value):
            return None
        if rule.breaches(value):
            return ts
    return None
