"""The policy's snapshot of the series store (LatestIndex): what each filter keeps, tick by tick.

For a CHANGED name (a counter) the snapshot returns only the series whose newest value differs
from the one the previous snapshot read, or that it has not read before (a series dropped
and recreated is a new one); the index keeps those
values by position and carries them over a rebuild (a series created or dropped). Randomized
sequences of appends, new series and drops are checked against that definition, computed
directly from the store.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ingest.series_store import SeriesKey, SeriesStore
from app.policy.world import CHANGED, LatestIndex, Threshold

pytestmark = pytest.mark.timeout(120)

COUNTER = "gpu_xid_critical_events_total"
RATIO = "gpu_utilization_ratio"
KEYS = [SeriesKey.of(f"n{i % 3}", COUNTER, {"gpu": str(i)}) for i in range(6)]
T0 = 1_800_000_000.0


def _newest_values(store: SeriesStore, name: str) -> dict[SeriesKey, float]:
    return {k: p.value for k, p in store.items() if k.name == name}


_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, len(KEYS) - 1), st.sampled_from([0.0, 1.0, 2.0, math.nan])),
    st.tuples(st.just("drop"), st.integers(0, len(KEYS) - 1), st.just(0.0)),
)


@settings(max_examples=300, deadline=None)
@given(ticks=st.lists(st.lists(_op, max_size=6), min_size=1, max_size=30))
def test_changed_returns_exactly_the_series_whose_value_moved(
    ticks: list[list[tuple[str, int, float]]],
) -> None:
    store = SeriesStore(window_seconds=900, max_points=4)
    index = LatestIndex([COUNTER], filters={COUNTER: CHANGED})
    read: dict[SeriesKey, float] = {}  # what the snapshots read so far
    now = T0
    for ops in ticks:
        now += 1
        for kind, k, value in ops:
            if kind == "put":
                store.append(KEYS[k], now, value)
            elif k == 0:  # every series forgotten (silent too long), recreated by its next sample
                store.drop_older_than(now + 1)
                read.clear()
            else:  # a recreated series is a new one: nothing of it has been read
                _drop(store, KEYS[k])
                read.pop(KEYS[k], None)
        newest = _newest_values(store, COUNTER)
        want = {
            k for k, v in newest.items() if k not in read or not (v == read[k])  # NaN: always
        }
        got = index.snapshot(store)[COUNTER]
        assert {k for k, _ in got} == want
        assert all(p.value == newest[k] or math.isnan(p.value) for k, p in got)
        read = dict(newest)


def _drop(store: SeriesStore, key: SeriesKey) -> None:
    """Drop one series as the store does for a silent one (and count the layout change)."""
    with store._lock:  # noqa: SLF001 - the test reaches in to drop a single series
        if store._series.pop(key, None) is not None:  # noqa: SLF001
            store.layout += 1


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
