"""The policy's snapshot of the series store (LatestIndex): what each filter keeps, tick by tick.

For a CHANGED name (a counter) the snapshot returns the series that received a sample whose
value differs from the newest one before it (NaN never equals itself) since the previous
snapshot, and those new to it (every series at the first snapshot; a series dropped and
recreated is a new one). Ingest keeps that answer as samples arrive (a standing question to the
store, ``app.series.watch``). Randomized sequences of appends, new series and drops are
checked against that definition, kept here from the same operations.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.policy.world import CHANGED, LatestIndex, Threshold
from app.series.store import SeriesKey, SeriesStore

pytestmark = pytest.mark.timeout(120)

COUNTER = "gpu_xid_critical_events_total"
RATIO = "gpu_utilization_ratio"
KEYS = [SeriesKey.of(f"n{i % 3}", COUNTER, {"gpu": str(i)}) for i in range(6)]
T0 = 1_800_000_000.0


def _newest_values(store: SeriesStore, name: str) -> dict[SeriesKey, float]:
    return {k: p.value for k, p in store.items() if k.name == name}


_op = st.one_of(
    st.tuples(
        st.just("put"), st.integers(0, len(KEYS) - 1), st.sampled_from([0.0, 1.0, 2.0, math.nan])
    ),
    st.tuples(st.just("drop"), st.integers(0, len(KEYS) - 1), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(ticks=st.lists(st.lists(_op, max_size=6), min_size=1, max_size=30))
def test_changed_returns_exactly_the_series_whose_value_moved(
    ticks: list[list[tuple[str, int, float]]],
) -> None:
    store = SeriesStore(window_seconds=900, max_points=4)
    index = LatestIndex([COUNTER], filters={COUNTER: CHANGED})
    moved: set[SeriesKey] = set()  # what the next snapshot must return
    now = T0
    for ops in ticks:
        now += 1
        for kind, k, value in ops:
            if kind == "put":
                before = store.latest(KEYS[k])
                store.append(KEYS[k], now, value)
                if before is None or not (before.value == value):  # NaN: always
                    moved.add(KEYS[k])
            elif k == 0:  # every series forgotten (silent too long), recreated by its next sample
                store.drop_older_than(now + 1)
                moved.clear()
            else:  # a recreated series is a new one
                store.forget([KEYS[k]])
                moved.discard(KEYS[k])
        newest = _newest_values(store, COUNTER)
        got = index.snapshot(store)[COUNTER]
        assert {k for k, _ in got} == moved
        assert all(p.value == newest[k] or math.isnan(p.value) for k, p in got)
        assert [k for k, _ in got] == [k for k in newest if k in moved]  # the store's order
        moved.clear()


def test_threshold_and_whole_names_skip_an_empty_buffer() -> None:
    store = SeriesStore(window_seconds=900, max_points=4)
    busy = SeriesKey.of("n0", RATIO, {"gpu": "0"})
    idle = SeriesKey.of("n0", RATIO, {"gpu": "1"})
    store.append(busy, T0, 0.9)
    store.append(idle, T0, 0.1)
    whole = LatestIndex([RATIO])
    high = LatestIndex([RATIO], filters={RATIO: Threshold("ge", 0.5)})
    assert [k for k, _ in whole.snapshot(store)[RATIO]] == [busy, idle]
    assert [k for k, _ in high.snapshot(store)[RATIO]] == [busy]
    store._series[idle].points.clear()  # noqa: SLF001 - the store never does; allowed anyway
    assert [k for k, _ in whole.snapshot(store)[RATIO]] == [busy]
    assert [k for k, _ in high.snapshot(store)[RATIO]] == [busy]
