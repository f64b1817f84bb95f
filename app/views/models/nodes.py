"""The Node page: per-GPU charts over the last hour, XID/ECC history, fingerprint.

History older than the in-memory window comes from the per-minute rollups; the newest minutes
come from the live window at full resolution, so a chart is both long and current.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlmodel import Session, select

from app.cluster import queries as cluster
from app.cluster.public import ParticipantPublic
from app.models import MetricRollup, from_epoch
from app.series.store import SeriesStore
from app.views.models.charts import ChartSpec, Threshold, aligned_chart
from app.views.models.health import (
    GPU_ECC_CORRECTED,
    GPU_ECC_UNCORRECTED,
    GPU_MEM_USED,
    GPU_METRICS,
    GPU_POWER,
    GPU_TEMP,
    GPU_TEMP_BAD_C,
    GPU_TEMP_WARN_C,
    GPU_UTIL,
    GPU_XID_CRITICAL,
    GpuNow,
    gpus_from_latest,
    liveness_level,
)

HISTORY_MINUTES = 60
LIVE_STEP_SECONDS = 10.0
XID_EVENTS = "gpu_xid_events_total"

# (metric, title, unit, scale)
NODE_CHARTS: tuple[tuple[str, str, str, float], ...] = (
    (GPU_UTIL, "GPU utilisation", "%", 100.0),
    (GPU_TEMP, "Temperature", "°C", 1.0),
    (GPU_MEM_USED, "Memory used", "GiB", 1 / 2**30),
    (GPU_POWER, "Power", "W", 1.0),
)


@dataclass(slots=True)
class CounterRow:
    gpu: str
    metric: str
    label: str
    first: float
    last: float
    increase: float
    last_change_ts: float | None


@dataclass(slots=True)
class NodeDetail:
    name: str
    level: str
    last_seen_age: float | None
    last_agent_id: str | None
    fingerprint: dict[str, Any]
    fingerprint_hash: str | None
    gpus: list[GpuNow]
    charts: list[ChartSpec]
    counters: list[CounterRow]
    participants: list[ParticipantPublic] = field(default_factory=list)


def _history(
    session: Session, store: SeriesStore, *, node: str, name: str, now: float
) -> dict[str, list[tuple[float, float]]]:
    """``{gpu: [(ts, value)]}``: rollup averages, then live points after the last rollup minute."""
    since = from_epoch(now) - timedelta(minutes=HISTORY_MINUTES)
    r = MetricRollup
    rows = session.exec(
        select(r.labels, r.minute, r.avg)
        .where(r.node == node, r.name == name, r.minute >= since)
        .order_by(r.minute)  # type: ignore[arg-type]
    ).all()
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for labels, minute, avg in rows:
        out[str((labels or {}).get("gpu", "?"))].append((minute.timestamp(), float(avg)))
    for key in store.keys(node=node, name=name):
        gpu = key.label("gpu") or "?"
        points = out[gpu]
        # Live points start where the rollups end: a rolled-up minute is not drawn twice.
        start = points[-1][0] + 60.0 if points else now - HISTORY_MINUTES * 60
        points.extend((p.ts, p.value) for p in store.since(key, start))
    return out


def _counter_rows(
    session: Session, store: SeriesStore, *, node: str, now: float
) -> list[CounterRow]:
    """XID and ECC counters that moved in the last hour (an increase is what matters)."""
    rows: list[CounterRow] = []
    labels = {
        GPU_XID_CRITICAL: "critical XID events",
        XID_EVENTS: "XID events",
        GPU_ECC_UNCORRECTED: "uncorrected ECC errors",
        GPU_ECC_CORRECTED: "corrected ECC errors",
    }
    for metric, label in labels.items():
        for gpu, points in sorted(
            _history(session, store, node=node, name=metric, now=now).items()
        ):
            if not points:
                continue
            values = [v for _, v in points]
            increase = 0.0
            last_change = None
            for (_, prev), (ts, cur) in zip(points, points[1:], strict=False):
                if cur != prev:
                    increase += cur - prev if cur >= prev else cur  # counter reset: count from 0
                    last_change = ts
            if increase > 0 or values[-1] > 0:
                rows.append(
                    CounterRow(
                        gpu=gpu,
                        metric=metric,
                        label=label,
                        first=values[0],
                        last=values[-1],
                        increase=increase,
                        last_change_ts=last_change,
                    )
                )
    return rows


def node_detail(
    *,
    session: Session,
    store: SeriesStore,
    name: str,
    now: float,
    suspect_after: float,
    confirm_after: float,
) -> NodeDetail:
    """Raises ``NotFound`` (from the cluster service) for a node that never registered."""
    base = cluster.node_detail(session, name=name, store=store, now=now)
    latest: dict[str, dict[str, float]] = defaultdict(dict)
    for series in base.latest:
        gpu = series.labels.get("gpu")
        if series.name in GPU_METRICS and gpu is not None:
            latest[gpu][series.name] = series.value
    charts: list[ChartSpec] = []
    for metric, title, unit, scale in NODE_CHARTS:
        history = _history(session, store, node=name, name=metric, now=now)
        spec = aligned_chart(
            title,
            {
                f"GPU {gpu}": pts
                for gpu, pts in sorted(history.items(), key=lambda kv: _gpu_order(kv[0]))
            },
            step_seconds=LIVE_STEP_SECONDS,
            unit=unit,
            scale=scale,
        )
        if metric == GPU_TEMP:
            spec.thresholds = [
                Threshold(GPU_TEMP_WARN_C, f"warning {GPU_TEMP_WARN_C:.0f} °C", "warn"),
                Threshold(GPU_TEMP_BAD_C, f"critical {GPU_TEMP_BAD_C:.0f} °C", "bad"),
            ]
        if metric == GPU_UTIL:
            spec.y_min, spec.y_max = 0.0, 100.0
        charts.append(spec)
    age = base.last_seen_age_seconds
    return NodeDetail(
        name=name,
        level=liveness_level(age, suspect_after=suspect_after, confirm_after=confirm_after),
        last_seen_age=age,
        last_agent_id=base.last_agent_id,
        fingerprint=dict(base.fingerprint or {}),
        fingerprint_hash=base.fingerprint_hash,
        gpus=gpus_from_latest(latest),
        charts=charts,
        counters=_counter_rows(session, store, node=name, now=now),
        participants=base.participants,
    )


def _gpu_order(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() else (1 << 30, index)
