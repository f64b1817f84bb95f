"""The Overview page: node grid with sparklines, summary tiles, jobs.

Cost matters here (the page polls, and a cluster has hundreds of nodes): the live part reads only
the latest point of each GPU series in one pass over the store; the sparklines come from the
per-minute rollups with one aggregate query, which is cached for the current minute because
rollups only change once a minute.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session, select

from app.models import Job, MetricRollup, Node, Participant, from_epoch
from app.services.dashboard.charts import ChartSpec, sparkline
from app.services.dashboard.health import (
    GPU_MEM_TOTAL,
    GPU_MEM_USED,
    GPU_METRICS,
    GPU_TEMP,
    GPU_UTIL,
    GpuNow,
    gpus_from_latest,
    liveness_level,
    worst,
)
from app.services.series_store import SeriesStore

SPARK_MINUTES = 30


@dataclass(slots=True)
class NodeCard:
    name: str
    level: str
    reasons: list[str]
    last_seen_age: float | None
    gpus: list[GpuNow]
    util: float | None  # mean over GPUs, 0..1
    temp: float | None  # hottest GPU
    mem: float | None  # used / total over all GPUs
    spark_util: ChartSpec
    spark_temp: ChartSpec
    spark_mem: ChartSpec
    incident_tiers: list[str] = field(default_factory=list)


@dataclass(slots=True)
class JobRow:
    name: str
    level: str
    phases: list[str]
    step: int | None
    participants: int
    suspected: int
    confirmed: int
    last_seen_age: float | None
    safe_mode: bool = False


@dataclass(slots=True)
class OverviewHealth:
    nodes: list[NodeCard]
    counts: dict[str, int]  # nodes per level
    gpus_total: int
    gpus_bad: int
    gpus_warn: int

    @property
    def nodes_total(self) -> int:
        return len(self.nodes)


# ---------------------------------------------------------------- live values from the store


def latest_gpu_values(store: SeriesStore) -> dict[str, dict[str, dict[str, float]]]:
    """``{node: {gpu: {metric: latest value}}}`` in one pass over the store."""
    result: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for key, point in store.items():
        if key.name not in GPU_METRICS:
            continue
        gpu = key.label("gpu")
        if gpu is None:
            continue
        result[key.node][gpu][key.name] = point.value
    return result


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def node_aggregates(gpus: list[GpuNow]) -> tuple[float | None, float | None, float | None]:
    utils = [g.util for g in gpus if g.util is not None]
    temps = [g.temp for g in gpus if g.temp is not None]
    used = [g.mem_used for g in gpus if g.mem_used is not None and g.mem_total]
    total = [g.mem_total for g in gpus if g.mem_used is not None and g.mem_total]
    mem = sum(used) / sum(total) if total else None
    return _mean(utils), (max(temps) if temps else None), mem


# ---------------------------------------------------------------- sparklines from rollups


@dataclass(slots=True)
class _SparkCache:
    key: tuple[int, datetime] | None = None
    value: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)


_spark_cache = _SparkCache()
_spark_lock = threading.Lock()


def _rollup_sparks(
    session: Session, *, since: datetime
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{node: {"util"|"temp"|"mem": [(minute ts, value)]}}`` aggregated over each node's GPUs."""
    r = MetricRollup
    rows = session.exec(  # type: ignore[call-overload]
        select(r.node, r.name, r.minute, sa.func.avg(r.avg), sa.func.max(r.max), sa.func.sum(r.avg))
        .where(r.name.in_([GPU_UTIL, GPU_TEMP, GPU_MEM_USED, GPU_MEM_TOTAL]))  # type: ignore[attr-defined]
        .where(r.minute >= since)
        .group_by(r.node, r.name, r.minute)
        .order_by(r.minute)
    ).all()
    util: dict[str, list[tuple[float, float]]] = defaultdict(list)
    temp: dict[str, list[tuple[float, float]]] = defaultdict(list)
    used: dict[tuple[str, float], float] = {}
    total: dict[tuple[str, float], float] = {}
    for node, name, minute, avg_of_avg, max_of_max, sum_of_avg in rows:
        ts = minute.timestamp()
        if name == GPU_UTIL:
            util[node].append((ts, float(avg_of_avg)))
        elif name == GPU_TEMP:
            temp[node].append((ts, float(max_of_max)))
        elif name == GPU_MEM_USED:
            used[(node, ts)] = float(sum_of_avg)
        else:
            total[(node, ts)] = float(sum_of_avg)
    mem: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (node, ts), u in sorted(used.items(), key=lambda kv: kv[0][1]):
        t = total.get((node, ts))
        if t:
            mem[node].append((ts, u / t))
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for node in set(util) | set(temp) | set(mem):
        out[node] = {
            "util": util.get(node, []),
            "temp": temp.get(node, []),
            "mem": mem.get(node, []),
        }
    return out


def rollup_sparks_cached(
    session: Session, *, now: float
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    minute = from_epoch(now).replace(second=0, microsecond=0)
    bind = session.get_bind()
    key = (id(bind), minute)
    with _spark_lock:
        if _spark_cache.key == key:
            return _spark_cache.value
    value = _rollup_sparks(session, since=minute - timedelta(minutes=SPARK_MINUTES))
    with _spark_lock:
        _spark_cache.key = key
        _spark_cache.value = value
    return value


def _spark_with_live(
    points: list[tuple[float, float]],
    live: float | None,
    now: float,
    *,
    scale: float = 1.0,
    unit: str = "",
) -> ChartSpec:
    series = [(ts, v * scale) for ts, v in points]
    if live is not None:
        series.append((now, live * scale))
    return sparkline(series, unit=unit)


# ---------------------------------------------------------------- the page's parts


def overview_health(
    *,
    session: Session,
    store: SeriesStore,
    now: float,
    suspect_after: float,
    confirm_after: float,
    incident_tiers_by_node: dict[str, list[str]] | None = None,
) -> OverviewHealth:
    """Every node with its GPUs' live state and 30-minute sparklines."""
    live = latest_gpu_values(store)
    sparks = rollup_sparks_cached(session, now=now)
    tiers_by_node = incident_tiers_by_node or {}
    nodes = session.exec(select(Node).order_by(Node.name)).all()
    known = {n.name for n in nodes}
    cards: list[NodeCard] = []
    counts = {"ok": 0, "warn": 0, "bad": 0, "idle": 0}
    gpus_total = gpus_bad = gpus_warn = 0
    # Nodes that stream samples but were never registered still deserve a card.
    names = sorted(known | set(live))
    last_seen = {n.name: n.last_seen_at for n in nodes}
    for name in names:
        gpus = gpus_from_latest(live.get(name, {}))
        seen = last_seen.get(name)
        age = None if seen is None else max(0.0, now - seen.timestamp())
        liveness = liveness_level(age, suspect_after=suspect_after, confirm_after=confirm_after)
        reasons: list[str] = []
        if liveness == "warn":
            reasons.append(f"silent {age:.0f}s (suspected)")
        elif liveness == "bad":
            reasons.append(f"silent {age:.0f}s")
        elif liveness == "idle":
            reasons.append("never reported")
        gpu_levels = []
        for gpu in gpus:
            level = gpu.level
            gpu_levels.append(level)
            gpus_total += 1
            if level == "bad":
                gpus_bad += 1
                reasons.append(f"GPU {gpu.index}: " + ", ".join(gpu.reasons))
            elif level == "warn":
                gpus_warn += 1
        tiers = tiers_by_node.get(name, [])
        tier_levels = ["bad" if t in ("medium", "heavy") else "warn" for t in tiers]
        if tiers:
            reasons.append(f"{len(tiers)} open incident{'s' if len(tiers) != 1 else ''}")
        # A silent node's old GPU values say nothing about now: liveness dominates.
        level = (
            liveness
            if liveness in ("bad", "idle")
            else worst([liveness, *gpu_levels, *tier_levels])
        )
        if level == "idle" and not gpus:
            level = "idle"
        counts[level] += 1
        util, temp, mem = node_aggregates(gpus)
        spark = sparks.get(name, {})
        cards.append(
            NodeCard(
                name=name,
                level=level,
                reasons=reasons,
                last_seen_age=age,
                gpus=gpus,
                util=util,
                temp=temp,
                mem=mem,
                spark_util=_spark_with_live(spark.get("util", []), util, now, scale=100, unit="%"),
                spark_temp=_spark_with_live(spark.get("temp", []), temp, now, unit="°C"),
                spark_mem=_spark_with_live(spark.get("mem", []), mem, now, scale=100, unit="%"),
                incident_tiers=tiers,
            )
        )
    return OverviewHealth(
        nodes=cards, counts=counts, gpus_total=gpus_total, gpus_bad=gpus_bad, gpus_warn=gpus_warn
    )


def job_rows(
    *,
    session: Session,
    now: float,
    suspect_after: float,
    confirm_after: float,
    safe_mode_jobs: set[str] | None = None,
) -> list[JobRow]:
    """Every job with its phases, step and how many participants are suspected or lost."""
    jobs = session.exec(select(Job).order_by(Job.name)).all()
    parts = session.exec(select(Participant)).all()
    by_job: dict[str, list[Participant]] = defaultdict(list)
    for p in parts:
        by_job[p.job_name].append(p)
    rows: list[JobRow] = []
    for job in jobs:
        members = by_job.get(job.name, [])
        levels = []
        suspected = confirmed = 0
        for p in members:
            lv = liveness_level(
                now - p.last_heartbeat_at.timestamp(),
                suspect_after=suspect_after,
                confirm_after=confirm_after,
            )
            levels.append(lv)
            suspected += lv == "warn"
            confirmed += lv == "bad"
        safe = job.name in (safe_mode_jobs or set())
        level = worst(levels) if levels else "idle"
        if safe:
            level = "bad"
        rows.append(
            JobRow(
                name=job.name,
                level=level,
                phases=sorted({p.phase for p in members}),
                step=max((p.step for p in members), default=None),
                participants=len(members),
                suspected=suspected,
                confirmed=confirmed,
                last_seen_age=None
                if job.last_seen_at is None
                else max(0.0, now - job.last_seen_at.timestamp()),
                safe_mode=safe,
            )
        )
    return rows
