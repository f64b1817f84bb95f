"""View-model pieces of app.views.models that the page tests do not pin down exactly."""

from __future__ import annotations

import json
import time

import pytest

from app.series.store import SeriesKey, SeriesStore
from app.views.models import overview
from app.views.models.charts import Band, ChartSpec, aligned_chart, safe_json
from app.views.models.health import GpuNow, gpu_level, liveness_level
from app.views.models.incidents import _detail_text, evidence_chart, evidence_from_store
from tests.harness.dashboard import DashboardApp


def test_safe_json_cannot_break_out_of_an_attribute_or_element() -> None:
    text = str(safe_json({"label": "</script><script>alert(1)</script>", "q": "it's & <b>"}))
    assert "<" not in text and ">" not in text and "'" not in text and "&" not in text
    assert json.loads(text)["label"] == "</script><script>alert(1)</script>"


def test_aligned_chart_buckets_series_onto_one_axis() -> None:
    spec = aligned_chart(
        "t", {"a": [(100.2, 1.0), (110.7, 2.0)], "b": [(101.0, 5.0)]}, step_seconds=10, scale=2
    )
    assert spec.x == [100.0, 110.0]
    assert spec.series == [
        {"label": "a", "values": [2.0, 4.0]},
        {"label": "b", "values": [10.0, None]},
    ]
    assert spec.latest == 10.0
    with pytest.raises(ValueError, match="step_seconds"):
        aligned_chart("t", {}, step_seconds=0)


def test_chart_json_omits_empty_parts() -> None:
    spec = ChartSpec(title="x", x=[1.0], series=[{"label": "a", "values": [1.0]}])
    assert json.loads(str(spec.json_markup())) == {
        "x": [1.0],
        "series": [{"label": "a", "values": [1.0]}],
    }
    spec.bands = [Band(None, 0.1, "ok")]
    assert json.loads(str(spec.json_markup()))["bands"] == [
        {"from": None, "to": 0.1, "level": "ok"}
    ]


def test_gpu_and_liveness_levels() -> None:
    assert gpu_level(GpuNow(index="0", util=0.9, temp=70)) == ("ok", [])
    assert gpu_level(GpuNow(index="0", util=0.9, temp=85))[0] == "warn"
    assert gpu_level(GpuNow(index="0", util=0.9, temp=91))[0] == "bad"
    assert gpu_level(GpuNow(index="0", lost=True)) == ("bad", ["GPU lost from the bus"])
    assert gpu_level(GpuNow(index="0", util=0.5, throttled=["power"]))[0] == "warn"
    assert gpu_level(GpuNow(index="0"))[0] == "idle"
    assert [
        liveness_level(a, suspect_after=15, confirm_after=60) for a in (None, 3, 15, 59, 60)
    ] == [
        "idle",
        "ok",
        "warn",
        "warn",
        "bad",
    ]


def test_evidence_chart_shows_window_and_threshold() -> None:
    spec = evidence_chart(
        {
            "metric": "m",
            "values": [[100, 1], [110, 5], ["bad", 1]],
            "window_seconds": 10,
            "threshold": 3,
        }
    )
    assert spec is not None
    assert spec.window == (100.0, 110.0)
    assert [t.value for t in spec.thresholds] == [3.0]
    assert evidence_chart({"metric": "m", "values": []}) is None


def test_counter_evidence_is_drawn_from_the_live_window() -> None:
    store = SeriesStore()
    labels = {"job": "j", "role": "trainer", "rank": "0"}
    for t in range(20):
        store.append(
            SeriesKey.of("n1", "state_log_write_errors_total", labels), 1000 + t, 0 if t < 12 else 3
        )
    store.append(
        SeriesKey.of("n1", "state_log_write_errors_total", {**labels, "rank": "1"}), 1000, 9
    )
    evidence = {
        "metric": "state_log_write_errors_total",
        "values": [[1012, 3]],
        "window_seconds": 60,
        "threshold": 0,
    }
    subject = {"node": "n1", "job": "j", "role": "trainer", "rank": 0}
    spec = evidence_from_store(store, evidence, subject, opened_at=1012.5, end=2000)
    assert spec is not None
    assert [s["label"] for s in spec.series] == ["trainer/0"]  # rank 1 is another subject
    assert spec.series[0]["values"][0] == 0 and spec.series[0]["values"][-1] == 3
    assert spec.window == (1012.0, 1072.0)  # from the first increase, for the detector's window
    assert spec.thresholds == []  # "rose by more than 0" is not a line on the raw counter
    assert evidence_from_store(store, evidence, {"job": "j"}, opened_at=1012.5, end=2000) is None


def test_detail_values_read_like_text() -> None:
    assert _detail_text(0.7327866554260254) == "0.733"
    assert _detail_text("2026-11-29T17:01:11.925238+00:00") == "2026-11-29 17:01:11 UTC"
    assert _detail_text(["restore_checkpoint", "restart_job"]) == "restore_checkpoint, restart_job"


def test_overview_tail_fills_the_gap_after_the_last_rollup(dash: DashboardApp) -> None:
    store = dash.store
    now = time.time()
    key = SeriesKey.of("n1", "gpu_utilization_ratio", {"gpu": "0"})
    store.append(key, now, 0.5)
    caches = overview.DashboardCaches()
    with dash.session() as s:
        first = overview.overview_health(
            caches=caches, session=s, store=store, now=now, suspect_after=15, confirm_after=60
        )
        store.append(key, now + 15, 0.7)
        second = overview.overview_health(
            caches=caches, session=s, store=store, now=now + 15, suspect_after=15, confirm_after=60
        )
    assert json.loads(str(first.sparklines))["util"]["n1"] == [50.0]
    blob = json.loads(str(second.sparklines))
    assert blob["x"] == [int(now), int(now + 15)]
    assert blob["util"]["n1"] == [50.0, 70.0]
