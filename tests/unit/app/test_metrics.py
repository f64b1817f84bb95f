from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics import build_registry
from app.series.store import SeriesKey, SeriesStore


def families(store: SeriesStore, labels: list[str] | None = None) -> dict[str, list]:
    registry, metrics = build_registry(store, labels or ["gpu", "job", "role"])
    metrics.ingest_batches.labels(result="accepted").inc(3)
    metrics.http_request_seconds.labels(
        method="POST", route="/api/v1/ingest", status="200"
    ).observe(0.004)
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):  # raises on malformed exposition
        out[fam.name] = [(s.name, s.labels, s.value) for s in fam.samples]
    return out


def test_latest_values_with_low_cardinality_labels() -> None:
    store = SeriesStore()
    store.append(SeriesKey.of("n1", "gpu_util", {"gpu": "0", "pid": "4242"}), 1.0, 10.0)
    store.append(SeriesKey.of("n1", "gpu_util", {"gpu": "0", "pid": "4242"}), 2.0, 20.0)
    store.append(SeriesKey.of("n1", "gpu_util", {"gpu": "1"}), 2.0, 30.0)
    store.append(
        SeriesKey.of("n2", "rollout_pending_ratio", {"job": "j", "role": "rollout"}), 5.0, 0.2
    )
    fam = families(store)
    gpu = sorted((s[1]["node"], s[1]["gpu"], s[2]) for s in fam["rlguard_gpu_util"])
    assert gpu == [("n1", "0", 20.0), ("n1", "1", 30.0)]
    assert all("pid" not in s[1] for s in fam["rlguard_gpu_util"])
    (ratio,) = fam["rlguard_rollout_pending_ratio"]
    assert ratio[1] == {"node": "n2", "gpu": "", "job": "j", "role": "rollout"} and ratio[2] == 0.2
    assert fam["rlguard_ingest_batches"][0][2] == 3.0
    assert any(
        s[0] == "rlguard_http_request_duration_seconds_bucket"
        for s in fam["rlguard_http_request_duration_seconds"]
    )


def test_ranks_collapse_to_the_newest_sample_and_are_counted() -> None:
    store = SeriesStore()
    store.append(
        SeriesKey.of("n1", "trainer_step", {"job": "j", "role": "trainer", "rank": "0"}), 10.0, 5.0
    )
    store.append(
        SeriesKey.of("n1", "trainer_step", {"job": "j", "role": "trainer", "rank": "1"}), 11.0, 6.0
    )
    store.append(
        SeriesKey.of("n1", "trainer_step", {"job": "j", "role": "trainer", "rank": "2"}), 9.0, 7.0
    )
    fam = families(store)
    (only,) = fam["rlguard_trainer_step"]
    assert only[2] == 6.0 and "rank" not in only[1]
    assert fam["rlguard_export_collapsed_series"][0][2] == 2.0


def test_counters_names_prefix_and_reserved_names() -> None:
    store = SeriesStore()
    store.append(SeriesKey.of("n1", "xid_errors_total", {"gpu": "0"}), 1.0, 4.0)
    store.append(SeriesKey.of("n1", "rlguard_already_prefixed"), 1.0, 1.0)
    # would shadow the server's own metric: skipped, and counted
    store.append(SeriesKey.of("n1", "ingest_batches_total"), 1.0, 99.0)
    store.append(SeriesKey.of("n1", "http_request_duration_seconds_bucket"), 1.0, 99.0)
    fam = families(store)
    assert fam["rlguard_xid_errors"][0][0] == "rlguard_xid_errors_total"
    assert fam["rlguard_xid_errors"][0][2] == 4.0
    assert "rlguard_already_prefixed" in fam
    assert fam["rlguard_ingest_batches"][0][2] == 3.0  # the server's value, not the agent's 99
    assert fam["rlguard_export_skipped_series"][0][2] == 2.0


def test_export_labels_are_configurable() -> None:
    store = SeriesStore()
    store.append(SeriesKey.of("n1", "m", {"gpu": "0", "rank": "3"}), 1.0, 1.0)
    fam = families(store, ["rank"])
    assert fam["rlguard_m"][0][1] == {"node": "n1", "rank": "3"}


def test_fresh_registries_do_not_collide() -> None:
    a = families(SeriesStore())
    b = families(SeriesStore())
    assert a["rlguard_ingest_batches"] == b["rlguard_ingest_batches"]
