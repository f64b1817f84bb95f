"""RollupWriter.compute (bisection over sorted windows) against a plain per-point reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.config import SeriesSettings
from app.series.rollups import RollupWriter
from app.series.store import SeriesKey, SeriesStore


def reference(points: list[tuple[float, float]], complete_before: float) -> list[tuple]:
    by_minute: dict[float, list[tuple[float, float]]] = {}
    for ts, v in points:
        if ts < complete_before:
            by_minute.setdefault(ts // 60 * 60, []).append((ts, v))
    out = []
    for minute in sorted(by_minute):
        pts = by_minute[minute]
        vals = [v for _, v in pts]
        last_ts, last = max(pts)
        out.append((minute, len(vals), min(vals), max(vals), sum(vals) / len(vals), last, last_ts))
    return out


samples = st.lists(
    st.tuples(
        st.floats(min_value=0, max_value=600, allow_nan=False).map(lambda x: round(x, 1)),
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    ),
    min_size=1,
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(samples)
def test_compute_matches_reference(points: list[tuple[float, float]]) -> None:
    store = SeriesStore(window_seconds=1e9, max_points=10_000)
    key = SeriesKey.of("n1", "gpu_util", {"gpu": "0"})
    store.extend((key, ts, v) for ts, v in points)  # out of order on purpose
    cfg = SeriesSettings(rollup_grace_seconds=0, window_seconds=1e9)
    writer = RollupWriter(engine=None, store=store, settings=cfg, metrics=None)  # type: ignore[arg-type]
    now = 480.0
    rows = writer.compute(now=now)
    got = [(r.minute, r.count, r.min, r.max, r.avg, r.last, r.last_ts) for r in rows]
    want = reference(points, complete_before=now // 60 * 60)
    # exact, except the mean: its sum runs in time order here, in arrival order there
    assert [g[:4] + g[5:] for g in got] == [w[:4] + w[5:] for w in want]
    assert [g[4] for g in got] == pytest.approx([w[4] for w in want], rel=1e-9, abs=1e-6)
    assert writer.compute(now=now) == []  # each minute is rolled once
