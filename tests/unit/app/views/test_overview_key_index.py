"""The Overview's index of GPU series (``overview._gpu_keys``): kept while the store holds the same
series, built again when they change, even when their count does not."""

from __future__ import annotations

from app.ingest.series_store import SeriesKey, SeriesStore
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


def test_the_index_is_kept_past_its_age_while_the_series_are_the_same() -> None:
    caches = overview.DashboardCaches()
    store = _store(["a", "b"])
    first = overview._gpu_keys(caches, store, T0)
    later = T0 + overview.KEY_INDEX_MAX_AGE_SECONDS + 1
    again = overview._gpu_keys(caches, store, later)
    assert again is first and again.built_at == later
    assert [(n, g) for n, g, _ in again.layout] == [("a", "0"), ("a", "1"), ("b", "0"), ("b", "1")]


def test_other_series_of_the_same_count_are_seen_at_the_next_look() -> None:
    caches = overview.DashboardCaches()
    store = _store(["a", "b"])
    first = overview._gpu_keys(caches, store, T0)
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
    # Within its age an index of as many series is taken as it is (as before this change).
    assert overview._gpu_keys(caches, store, T0 + 1) is first
    later = overview._gpu_keys(caches, store, T0 + overview.KEY_INDEX_MAX_AGE_SECONDS + 2)
    assert [(n, g) for n, g, _ in later.layout] == [("c", "0"), ("c", "1")]
    assert {k.node for k in later.keys} == {"c"}


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
    live = overview.live_gpus(overview.DashboardCaches(), store, now=T0)["a"]
    expected = gpus_from_latest(values)
    assert [g.index for g in live] == ["0", "1", "2", "3", "10", "x"]
    assert live == expected
    assert [(g.level, list(g.reasons), g.title) for g in live] == [
        (g.level, list(g.reasons), g.title) for g in expected
    ]
    assert live[1].level == "warn" and live[2].level == "bad" and live[4].level == "idle"
