from __future__ import annotations

import threading

import pytest

from app.series.store import SeriesKey, SeriesStore


def test_latest_since_and_window_trim() -> None:
    store = SeriesStore(window_seconds=10, max_points=100)
    key = SeriesKey.of("n1", "gpu_util", {"gpu": "0"})
    for t in range(30):
        store.append(key, float(t), float(t * 2))
    assert store.latest(key).value == 58.0
    pts = store.since(key, 0)
    assert pts[0].ts == 19.0  # older than newest - window was dropped
    assert [p.ts for p in store.since(key, 25)] == [25.0, 26.0, 27.0, 28.0, 29.0]


def test_max_points_bounds_memory() -> None:
    store = SeriesStore(window_seconds=1e9, max_points=5)
    key = SeriesKey.of("n1", "x")
    store.extend((key, float(t), 1.0) for t in range(50))
    assert len(store.since(key, 0)) == 5


def test_out_of_order_sample_is_inserted_in_order() -> None:
    store = SeriesStore()
    key = SeriesKey.of("n1", "x")
    store.extend([(key, 1.0, 1.0), (key, 3.0, 3.0), (key, 2.0, 2.0)])
    assert [p.ts for p in store.since(key, 0)] == [1.0, 2.0, 3.0]
    assert store.latest(key).value == 3.0


def test_labels_are_order_insensitive() -> None:
    a = SeriesKey.of("n", "m", {"a": "1", "b": "2"})
    b = SeriesKey.of("n", "m", {"b": "2", "a": "1"})
    assert a == b
    assert a.label("b") == "2"
    assert a.label("zz") is None


def test_rate_handles_counter_reset() -> None:
    store = SeriesStore()
    key = SeriesKey.of("n", "xid_total")
    store.extend([(key, 0.0, 10.0), (key, 1.0, 12.0), (key, 2.0, 1.0), (key, 4.0, 3.0)])
    # increases: 2, reset->1, 2 => 5 over 4 s
    assert store.rate(key, 100, now=4.0) == pytest.approx(1.25)


def test_drop_older_than_and_keys_filter() -> None:
    store = SeriesStore()
    store.append(SeriesKey.of("a", "m"), 1.0, 1.0)
    store.append(SeriesKey.of("b", "m"), 100.0, 1.0)
    assert {k.node for k in store.keys(name="m")} == {"a", "b"}
    assert store.drop_older_than(50.0) == 1
    assert [k.node for k in store.keys()] == ["b"]


def test_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError):
        SeriesStore(window_seconds=0)


def test_out_of_order_into_a_full_window_keeps_the_newest_points_in_order() -> None:
    store = SeriesStore(window_seconds=1e9, max_points=5)
    key = SeriesKey.of("n1", "x")
    store.extend((key, float(t), float(t)) for t in (10, 20, 30, 40, 50))
    store.extend([(key, 35.0, 35.0), (key, 5.0, 5.0), (key, 45.0, 45.0)])
    got = [p.ts for p in store.since(key, 0)]
    assert got == sorted(got) and len(got) == 5
    assert got == [30.0, 35.0, 40.0, 45.0, 50.0]


def test_out_of_order_matches_a_sorted_reference() -> None:
    import random

    rng = random.Random(7)
    store = SeriesStore(window_seconds=1e9, max_points=50)
    key = SeriesKey.of("n1", "x")
    reference: list[float] = []
    for _ in range(400):
        ts = float(rng.randint(0, 1000))
        store.append(key, ts, ts)
        reference.append(ts)
        reference.sort()
        reference[:] = reference[-50:]
        assert [p.ts for p in store.since(key, -1)] == reference


class _CountingLock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acquired = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.acquired += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_between_is_half_open_and_agrees_with_since() -> None:
    store = SeriesStore(window_seconds=1e9, max_points=1000)
    key = SeriesKey.of("n1", "x")
    # out of order on purpose: the window stays sorted, so bisection is valid
    store.extend([(key, float(t), float(t) / 2) for t in (0, 1, 2, 5, 3, 4, 6, 6, 7)])
    assert store.between(key, 2.0, 6.0) == [(2.0, 1.0), (3.0, 1.5), (4.0, 2.0), (5.0, 2.5)]
    assert store.between(key, 6.0) == [(6.0, 3.0), (6.0, 3.0), (7.0, 3.5)]  # no end: to newest
    assert store.between(key, 2.5, 2.9) == []
    assert store.between(key, 9.0) == []
    assert store.between(SeriesKey.of("n1", "unknown"), 0.0) == []
    for start in (-1.0, 0.0, 3.5, 6.0, 8.0):
        since = store.since(key, start)
        assert [tuple(p) for p in since] == store.between(key, start)
        assert all(p.ts >= start for p in since)


def test_buffers_are_the_live_ones_of_the_names_asked_for_with_the_layout() -> None:
    store = SeriesStore()
    temp, util = SeriesKey.of("n1", "temp", {"gpu": "0"}), SeriesKey.of("n1", "util", {"gpu": "0"})
    store.append(temp, 1.0, 60.0)
    store.append(util, 1.0, 0.5)
    layout, found = store.buffers({"temp"})
    assert layout == store.layout and [k for k, _ in found] == [temp]
    buffer = found[0][1]
    store.append(temp, 2.0, 61.0)
    assert store.layout == layout and buffer[-1] == (2.0, 61.0)  # read in place, no rebuild
    store.forget([temp])
    assert store.layout != layout  # a reader that kept the buffer knows to ask again
    assert store.buffers({"temp"})[1] == []
