"""Standing questions to the series store (SeriesWatch): the answers ingest keeps equal the ones
a full read of everything appended would give.

The reference keeps every sample each series accepted, unbounded and in order, so it also knows
a run that began before the store's buffer (trimmed by window or length) still holds it.
Randomized sequences of in-order and late (out-of-order) samples, trimming, series dropped one
at a time or by silence, and watches registered on a store that already holds data are checked
after every step.
"""

from __future__ import annotations

import bisect
import gc
import math
import operator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from app.series.store import SeriesKey, SeriesStore
from app.series.watch import RunRule, SeriesWatch

pytestmark = pytest.mark.timeout(120)

T0 = 1_800_000_000.0
LEVEL = "gpu_temperature_celsius"  # passing: >= 85
COUNTER = "gpu_xid_events_total"  # changed
LATENCY = "state_log_write_latency_ms"  # runs: breach > 200, healthy <= 50
RULE = RunRule(operator.gt, 200.0, 50.0)
KEYS = [
    SeriesKey.of(f"n{i}", name, {"gpu": "0"})
    for name in (LEVEL, COUNTER, LATENCY)
    for i in range(2)
]
VALUES = (0.0, 1.0, 10.0, 50.0, 85.0, 120.0, 200.0, 250.0, math.nan)


def _watch(store: SeriesStore) -> SeriesWatch:
    return store.watch(
        SeriesWatch(passing={LEVEL: (operator.ge, 85.0)}, changed=[COUNTER], runs={LATENCY: RULE})
    )


class Reference:
    """Every sample each series kept, in the store's order, and the counters' moves."""

    def __init__(self) -> None:
        self.history: dict[SeriesKey, list[tuple[float, float]]] = {}
        self.moved: set[SeriesKey] = set()

    def add(self, key: SeriesKey, ts: float, value: float) -> None:
        pts = self.history.setdefault(key, [])
        if pts and ts < pts[-1][0]:
            pts.insert(bisect.bisect_right([p[0] for p in pts], ts), (ts, value))
            return
        if key.name == COUNTER and (not pts or not pts[-1][1] == value):
            self.moved.add(key)
        pts.append((ts, value))

    def forget(self, key: SeriesKey) -> None:
        self.history.pop(key, None)
        self.moved.discard(key)

    def passing(self) -> dict[SeriesKey, tuple[float, float]]:
        return {k: p[-1] for k, p in self.history.items() if k.name == LEVEL and p[-1][1] >= 85.0}

    def runs(self) -> dict[SeriesKey, float]:
        out = {}
        for key, pts in self.history.items():
            if key.name != LATENCY:
                continue
            for ts, value in reversed(pts):
                if value > 200.0:
                    out[key] = ts
                    break
                if not value > 50.0:
                    break
        return out


def _check(store: SeriesStore, watch: SeriesWatch, ref: Reference) -> None:
    got = watch.take()
    assert {k: p for k, p in got.passing[LEVEL]} == ref.passing()
    newest = {k: p[-1] for k, p in ref.history.items()}
    assert {k: p for k, p in got.changed[COUNTER]} == {k: newest[k] for k in ref.moved}
    assert {k: since for k, since, _ in got.runs[LATENCY]} == ref.runs()
    assert all(p == newest[k] for k, _, p in got.runs[LATENCY])
    ref.moved.clear()


_op = st.one_of(
    # a sample: its series, value, and how late (0: in order; >0: behind the newest)
    st.tuples(
        st.just("put"),
        st.integers(0, len(KEYS) - 1),
        st.sampled_from(VALUES),
        st.sampled_from([0.0, 0.0, 0.0, 0.5, 2.0, 30.0]),
    ),
    st.tuples(st.just("forget"), st.integers(0, len(KEYS) - 1), st.just(0.0), st.just(0.0)),
    st.tuples(st.just("silence"), st.just(0), st.just(0.0), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
# Always run, whatever the draw: a run ended by a sample exactly at the healthy level; a run that
# began before a short buffer, read again after a late sample.
@example(
    max_points=4, window=900.0, before=[], steps=[[("put", 4, 250.0, 0.0)], [("put", 4, 50.0, 0.0)]]
)
@example(
    max_points=2,
    window=900.0,
    before=[("put", 4, 250.0, 0.0)],
    steps=[[("put", 4, 120.0, 0.0)], [("put", 4, 120.0, 0.0)], [("put", 4, 85.0, 0.5)]],
)
@given(
    max_points=st.sampled_from([2, 4, 1200]),
    window=st.sampled_from([20.0, 900.0]),
    before=st.lists(_op, max_size=10),
    steps=st.lists(st.lists(_op, max_size=6), min_size=1, max_size=25),
)
def test_answers_equal_a_full_read_of_everything_appended(
    max_points: int, window: float, before: list, steps: list
) -> None:
    store = SeriesStore(window_seconds=window, max_points=max_points)
    ref = Reference()
    now = T0

    def apply(ops: list) -> None:
        for kind, k, value, late in ops:
            key = KEYS[k]
            if kind == "put":
                ts = now - late
                if _kept(store, key, ts):
                    ref.add(key, ts, value)
                store.append(key, ts, value)
            elif kind == "forget":
                store.forget([key])
                ref.forget(key)
            else:  # series silent for 10 s are dropped
                for gone in [k for k, p in ref.history.items() if p[-1][0] < now - 10]:
                    ref.forget(gone)
                store.drop_older_than(now - 10)

    apply(before)  # the watch starts on a store that already holds these
    watch = _watch(store)
    ref.moved = set(ref.history) & {k for k in KEYS if k.name == COUNTER}  # all count as moved
    for ops in steps:
        now += 1.0
        apply(ops)
        _check(store, watch, ref)


def _kept(store: SeriesStore, key: SeriesKey, ts: float) -> bool:
    """Whether the store keeps a sample at ``ts``: always, unless it is late (behind the newest)
    and older than everything in a full buffer (refused) or than the window (trimmed at once:
    gone as if it never came)."""
    stamps = [p[0] for p in store.between(key, -math.inf)]
    if not stamps or ts >= stamps[-1]:
        return True
    full = len(stamps) == store.max_points
    return (
        not (full and bisect.bisect_right(stamps, ts) == 0)
        and ts >= stamps[-1] - store.window_seconds
    )


def test_a_run_older_than_the_buffer_outlives_a_late_sample() -> None:
    store = SeriesStore(window_seconds=900, max_points=3)
    watch = _watch(store)
    key = KEYS[4]
    store.extend(
        [(key, T0, 300.0), (key, T0 + 1, 100.0), (key, T0 + 2, 100.0), (key, T0 + 3, 100.0)]
    )
    store.append(key, T0 + 2.5, 120.0)  # late: the buffer is read again, the breach is gone from it
    [(_, since, _)] = watch.take().runs[LATENCY]
    assert since == T0


def test_a_late_healthy_sample_ends_the_run() -> None:
    store = SeriesStore()
    watch = _watch(store)
    key = KEYS[4]
    store.extend([(key, T0, 300.0), (key, T0 + 2, 100.0)])
    store.append(key, T0 + 1, 10.0)
    assert watch.take().runs[LATENCY] == []


def test_a_watch_nobody_holds_stops_costing_ingest() -> None:
    store = SeriesStore()
    watch = _watch(store)
    store.append(KEYS[0], T0, 90.0)
    assert watch.take().passing[LEVEL] == [(KEYS[0], (T0, 90.0))]
    del watch
    gc.collect()
    store.append(KEYS[0], T0 + 1, 95.0)
    assert store._current_handlers() == {}  # noqa: SLF001 - nothing left to do per sample
