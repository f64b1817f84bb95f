"""The Overview's index of GPU series (``overview._gpu_index``): kept while the store creates and
drops no series, built again when it does, even when their count stays the same."""

from __future__ import annotations

from app.series.store import SeriesKey, SeriesStore
from app.views.models import overview
from app.views.models.health import GPU_TEMP, GPU_UTIL

T0 = 1_000_000.0


def _store(nodes: list[str]) -> SeriesStore:
    store = SeriesStore()
    for node in nodes:
        for gpu in ("0", "1"):
            store.append(SeriesKey.of(node, GPU_TEMP, {"gpu": gpu}), T0, 60.0)
            store.append(SeriesKey.of(node, GPU_UTIL, {"gpu": gpu}), T0, 0.5)
    return store


def test_the_index_is_kept_while_the_store_creates_and_drops_no_series() -> None:
    caches = overview.DashboardCaches()
    store = _store(["a", "b"])
    first = overview._gpu_index(caches, store)
    store.append(SeriesKey.of("a", GPU_TEMP, {"gpu": "0"}), T0 + 1, 70.0)  # a new sample only
    again = overview._gpu_index(caches, store)
    assert again is first
    assert [(n, g) for n, g, _ in again.gpus] == [("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")]
    # read in place: the new sample is what the overview shows, without a rebuild
    assert overview.live_gpus(caches, store)["a"][0].temp == 70.0


def test_other_series_of_the_same_count_are_seen_at_once() -> None:
    caches = overview.DashboardCaches()
    store = _store(["a", "b"])
    first = overview._gpu_index(caches, store)
    # Nodes a's and b's series age out and node c's arrive: as many series as before, other ones.
    store.append(SeriesKey.of("c", "host_load", {}), T0 + 2000, 1.0)
    store.drop_older_than(T0 + 1)
    for gpu in ("0", "1"):
        store.append(SeriesKey.of("c", GPU_TEMP, {"gpu": gpu}), T0 + 2000, 61.0)
        store.append(SeriesKey.of("c", GPU_UTIL, {"gpu": gpu}), T0 + 2000, 0.4)
    store.append(SeriesKey.of("c", "host_mem", {}), T0 + 2000, 1.0)
    store.append(SeriesKey.of("c", "host_net", {}), T0 + 2000, 1.0)
    store.append(SeriesKey.of("c", "host_disk", {}), T0 + 2000, 1.0)
    assert len(store) == 8
    later = overview._gpu_index(caches, store)
    assert later is not first
    assert [(n, g) for n, g, _ in later.gpus] == [("c", "0"), ("c", "1")]
    assert set(overview.live_gpus(caches, store)) == {"c"}


def test_a_series_dropped_and_made_again_is_read_from_its_new_buffer() -> None:
    caches = overview.DashboardCaches()
    store = _store(["a"])
    overview._gpu_index(caches, store)
    key = SeriesKey.of("a", GPU_TEMP, {"gpu": "1"})
    store.forget([key])
    store.append(key, T0 + 5, 88.0)  # same key, a new buffer, the same series count
    gpu1 = overview.live_gpus(caches, store)["a"][1]
    assert (gpu1.index, gpu1.temp, gpu1.level) == ("1", 88.0, "warn")


def test_the_overview_judges_each_gpu_as_the_node_page_does() -> None:
    """The Overview reads every GPU series at once (``live_gpus``); the node page builds GPUs from
    one node's latest values (``gpus_from_latest``): the same values, the same judgement."""
    from app.views.models.health import (
        GPU_LOST,
        GPU_MEM_TOTAL,
        GPU_MEM_USED,
        GPU_REMAP_FAILURE,
        GPU_THROTTLE_POWER,
        GPU_THROTTLE_THERMAL,
        gpus_from_latest,
    )

    values = {
        "0": {GPU_TEMP: 60.0, GPU_UTIL: 0.9, GPU_MEM_USED: 40.0, GPU_MEM_TOTAL: 80.0},
        "1": {GPU_TEMP: 85.0, GPU_THROTTLE_POWER: 1.0, GPU_THROTTLE_THERMAL: 1.0},
        "2": {GPU_TEMP: 95.0, GPU_REMAP_FAILURE: 1.0, GPU_THROTTLE_THERMAL: 0.0},
        "3": {GPU_LOST: 1.0, GPU_TEMP: 70.0},
        "10": {GPU_THROTTLE_THERMAL: 1.0},  # no util, temp or memory: no samples
        "x": {GPU_UTIL: 0.1},
    }
    store = SeriesStore()
    for gpu, metrics in values.items():
        for name, value in metrics.items():
            store.append(SeriesKey.of("a", name, {"gpu": gpu}), T0, value)
    live = overview.live_gpus(overview.DashboardCaches(), store)["a"]
    expected = gpus_from_latest(values)
    assert [g.index for g in live] == ["0", "1", "2", "3", "10", "x"]
    assert live == expected
    assert [(g.level, list(g.reasons), g.title) for g in live] == [
        (g.level, list(g.reasons), g.title) for g in expected
    ]
    assert live[1].level == "warn" and live[2].level == "bad" and live[4].level == "idle"


def test_reading_in_place_while_ingest_appends_and_trims_sees_only_written_values() -> None:
    """The buffers are read without the store's lock: while ingest appends (and trims a full
    window at every sample), each read is some sample that was written, never an error."""
    import threading

    store = SeriesStore(window_seconds=5.0, max_points=4)
    keys = [SeriesKey.of("a", GPU_TEMP, {"gpu": str(g)}) for g in range(8)]
    for key in keys:
        store.append(key, T0, 50.0)
    caches = overview.DashboardCaches()
    index = overview._gpu_index(caches, store)
    stop = threading.Event()

    def ingest() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            store.extend([(key, T0 + i, 50.0 + i % 40) for key in keys])

    writer = threading.Thread(target=ingest)
    writer.start()
    try:
        for _ in range(2000):
            temps = {g.temp for g in overview.live_gpus(caches, store)["a"]}
            assert temps <= {50.0 + j for j in range(40)}, temps
    finally:
        stop.set()
        writer.join(timeout=10)
    assert overview._gpu_index(caches, store) is index  # no series made: never rebuilt
