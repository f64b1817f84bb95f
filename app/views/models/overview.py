"""The Overview page: node grid with sparklines, summary tiles, jobs.

Cost matters here (the page polls, and a cluster has hundreds of nodes): the live part reads only
the latest point of each GPU series the grid needs; the sparklines come from the per-minute
rollups with one aggregate query, which is cached for the current minute because rollups only
change once a minute, and travel to the browser as one JSON document with a shared time axis.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from markupsafe import Markup
from sqlmodel import Session, select

from app.guardrails.automation import Switches
from app.models import Job, MetricRollup, Node, Participant, from_epoch
from app.series.store import Buffer, SeriesStore
from app.views.models.charts import safe_json
from app.views.models.health import (
    GPU_LOST,
    GPU_MEM_TOTAL,
    GPU_MEM_USED,
    GPU_REMAP_FAILURE,
    GPU_TEMP,
    GPU_THROTTLE_POWER,
    GPU_THROTTLE_THERMAL,
    GPU_UTIL,
    GpuNow,
    liveness_level,
    worst,
)
from app.views.models.stale_while_refresh import StaleWhileRefresh

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
    dry_run: bool = False
    hands_off: bool = False


@dataclass(slots=True)
class OverviewHealth:
    nodes: list[NodeCard]
    counts: dict[str, int]  # nodes per level
    gpus_total: int
    gpus_bad: int
    gpus_warn: int
    # One JSON document with every node's sparklines on a shared time axis (see sparkline_blob).
    sparklines: Markup

    @property
    def nodes_total(self) -> int:
        return len(self.nodes)


# ---------------------------------------------------------------- live values from the store


# The metrics the node grid needs (colour and sparklines); the node page shows the rest.
OVERVIEW_GPU_METRICS = frozenset(
    {
        GPU_UTIL,
        GPU_TEMP,
        GPU_MEM_USED,
        GPU_MEM_TOTAL,
        GPU_LOST,
        GPU_THROTTLE_THERMAL,
        GPU_THROTTLE_POWER,
        GPU_REMAP_FAILURE,
    }
)


@dataclass(slots=True)
class _GpuIndex:
    """Every overview GPU series' sample buffer, grouped by node and then GPU (sorted as the grid
    shows them), so a render reads them in place and walks the groups without a look-up. Kept
    while the store's ``layout`` (series created or dropped) is the one it was built for."""

    store_id: int = 0
    layout: int = -1
    gpus: list[tuple[str, str, tuple[str, ...]]] = field(default_factory=list)  # node, gpu, names
    buffers: list[Buffer] = field(default_factory=list)  # those names' buffers, GPU after GPU


def _gpu_sort(gpu: str) -> tuple[bool, int, str]:
    digits = gpu.isdigit()
    return (not digits, int(gpu) if digits else 0, gpu)


def _gpu_index(caches: DashboardCaches, store: SeriesStore) -> _GpuIndex:
    """The overview's GPU series; rebuilt (one pass over the store, ~40 ms per 80,000 series)
    only when the store created or dropped a series since."""
    with caches.lock:
        index = caches.gpu_index
    if index.store_id == id(store) and index.layout == store.layout:
        return index
    layout, found = store.buffers(OVERVIEW_GPU_METRICS)
    groups: dict[tuple[str, str], list[tuple[str, Buffer]]] = {}
    for key, buffer in found:
        gpu = key.label("gpu")
        if gpu is not None:
            groups.setdefault((key.node, gpu), []).append((key.name, buffer))
    built = _GpuIndex(store_id=id(store), layout=layout)
    for node, gpu in sorted(groups, key=lambda ng: (ng[0], _gpu_sort(ng[1]))):
        members = groups[(node, gpu)]
        built.gpus.append((node, gpu, tuple(name for name, _ in members)))
        built.buffers.extend(buffer for _, buffer in members)
    with caches.lock:
        caches.gpu_index = built
    return built


def live_gpus(caches: DashboardCaches, store: SeriesStore) -> dict[str, list[GpuNow]]:
    """Every node's GPUs with their latest values, judged and sorted, in one pass."""
    index = _gpu_index(caches, store)
    # One iterator over the buffers: each GPU's zip takes as many as it has names (zip asks
    # ``names`` first, so it stops without taking the next GPU's first buffer).
    buffers = iter(index.buffers)
    result: dict[str, list[GpuNow]] = {}
    for node, gpu, names in index.gpus:
        # zip must not be strict (see above); a buffer is never empty (SeriesStore.buffers)
        values = {name: buffer[-1][1] for name, buffer in zip(names, buffers)}  # noqa: B905
        gpus = result.get(node)
        if gpus is None:
            gpus = result[node] = []
        gpus.append(GpuNow.of(gpu, values))  # already in grid order (the layout is sorted)
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
class SparkColumns:
    """Rollup history of every node's sparklines on one shared axis of minutes."""

    x: list[int] = field(default_factory=list)
    columns: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)


SPARK_SCALE = {"util": 100.0, "temp": 1.0, "mem": 100.0}


def _rollup_sparks(session: Session, *, since: datetime) -> SparkColumns:
    """Per node and minute: mean GPU utilisation, hottest GPU, memory used / total."""
    r = MetricRollup
    # Six columns: more than the typed overloads of select() cover.
    query = sa.select(  # type: ignore[call-overload]
        r.node, r.name, r.minute, sa.func.avg(r.avg), sa.func.max(r.max), sa.func.sum(r.avg)
    )
    rows = session.exec(
        query.where(r.name.in_([GPU_UTIL, GPU_TEMP, GPU_MEM_USED, GPU_MEM_TOTAL]))  # type: ignore[attr-defined]
        .where(r.minute >= since)
        .group_by(r.node, r.name, r.minute)
    ).all()
    minutes = sorted({minute.timestamp() for _, _, minute, _, _, _ in rows})
    position = {ts: i for i, ts in enumerate(minutes)}
    columns: dict[str, dict[str, list[float | None]]] = {"util": {}, "temp": {}, "mem": {}}
    used: dict[tuple[str, float], float] = {}
    total: dict[tuple[str, float], float] = {}

    def put(metric: str, node: str, ts: float, value: float) -> None:
        column = columns[metric].setdefault(node, [None] * len(minutes))
        column[position[ts]] = round(value * SPARK_SCALE[metric], 1)

    for node, name, minute, avg_of_avg, max_of_max, sum_of_avg in rows:
        ts = minute.timestamp()
        if name == GPU_UTIL:
            put("util", node, ts, float(avg_of_avg))
        elif name == GPU_TEMP:
            put("temp", node, ts, float(max_of_max))
        elif name == GPU_MEM_USED:
            used[(node, ts)] = float(sum_of_avg)
        else:
            total[(node, ts)] = float(sum_of_avg)
    for (node, ts), u in used.items():
        t = total.get((node, ts))
        if t:
            put("mem", node, ts, u / t)
    return SparkColumns(x=[int(ts) for ts in minutes], columns=columns)


def rollup_sparks_cached(caches: DashboardCaches, session: Session, *, now: float) -> SparkColumns:
    """The last 30 minutes of rollups, recomputed once a minute (rollups change once a minute).

    When the minute turns, requests keep getting the previous minute's columns while one
    background thread runs the aggregate query, so no page view waits for it; only the very
    first view of a process (or of another database) computes it inline.
    """
    minute = from_epoch(now).replace(second=0, microsecond=0)

    def rollups(session: Session, minute_ts: float) -> SparkColumns:
        return _rollup_sparks(
            session, since=from_epoch(minute_ts) - timedelta(minutes=SPARK_MINUTES)
        )

    # Stamped with its minute, the value is fresh for that minute and served stale after it.
    return caches.sparks.get(
        session,
        key=id(session.get_bind()),
        now=minute.timestamp(),
        compute=rollups,
        fresh_for=60.0,
    )


NodeNow = tuple[float | None, float | None, float | None]  # util 0..1, hottest °C, memory 0..1
TAIL_STEP_SECONDS = 10.0


@dataclass(slots=True)
class _LiveTail:
    """What the overview itself saw in the last minutes, at most one entry per 10 s.

    Rollups reach the database a minute or more after the fact; this tail fills the gap
    between the newest rollup minute and now, from values each render computes anyway.
    """

    store_id: int = 0
    entries: deque[tuple[int, dict[str, NodeNow]]] = field(
        default_factory=lambda: deque(maxlen=int(SPARK_MINUTES * 60 / TAIL_STEP_SECONDS))
    )


@dataclass(slots=True)
class TimedMemo:
    """One value and when it was made (``app/views/models/ettr_tiles.py``)."""

    key: int = 0
    built_at: float = -math.inf
    value: Any = None


@dataclass(slots=True)
class DashboardCaches:
    """What the overview keeps between renders, one per app (``app.state.dashboard_caches``):
    the index of GPU series, last minute's sparklines, the live tail, the fleet view's last
    judgement of every node and the cluster ETTR tiles. ``lock`` guards them."""

    gpu_index: _GpuIndex = field(default_factory=_GpuIndex)
    sparks: StaleWhileRefresh[SparkColumns] = field(
        default_factory=lambda: StaleWhileRefresh(
            thread_name="rlguard-sparklines", what="the sparkline rollup query"
        )
    )
    tail: _LiveTail = field(default_factory=_LiveTail)
    # The fleet view's last judgement of every node (``app/views/models/fleet.py``).
    states: StaleWhileRefresh[NodeStates] = field(
        default_factory=lambda: StaleWhileRefresh(
            thread_name="rlguard-fleet-states", what="judging the fleet"
        )
    )
    ettr: TimedMemo = field(default_factory=TimedMemo)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expire_states(self) -> None:
        """The next fleet partial judges every node itself (benchmarks/dashboard.py times the
        cold heat map that way: a request that finds no recent judgement)."""
        self.states.forget()


def record_tail(
    caches: DashboardCaches, store: SeriesStore, now: float, current: dict[str, NodeNow]
) -> list[tuple[int, dict[str, NodeNow]]]:
    tail = caches.tail
    with caches.lock:
        if tail.store_id != id(store):
            tail.store_id = id(store)
            tail.entries.clear()
        if not tail.entries or now - tail.entries[-1][0] >= TAIL_STEP_SECONDS:
            tail.entries.append((int(now), dict(current)))
        return list(tail.entries)


def sparkline_blob(
    history: SparkColumns,
    tail: list[tuple[int, dict[str, NodeNow]]],
    live: dict[str, NodeNow],
    *,
    now: float,
) -> Markup:
    """``{"x": [...], "util": {node: [...]}, "temp": {...}, "mem": {...}}`` as safe JSON.

    All nodes share one x axis (rollup minutes, then the overview's own recent samples, then
    now), so the page carries it once instead of once per sparkline (a 125-node overview has
    375 of them).
    """
    rolled_until = history.x[-1] + 60 if history.x else 0
    recent = [(ts, values) for ts, values in tail if rolled_until <= ts < int(now)]
    x = [*history.x, *(ts for ts, _ in recent), int(now)]
    out: dict[str, Any] = {"x": x, "util": {}, "temp": {}, "mem": {}}
    for node, current in live.items():
        for i, metric in enumerate(("util", "temp", "mem")):
            scale = SPARK_SCALE[metric]
            past = history.columns.get(metric, {}).get(node)
            column: list[float | None] = list(past) if past is not None else [None] * len(history.x)
            for _, values in recent:
                value = values.get(node, (None, None, None))[i]
                column.append(None if value is None else round(value * scale, 1))
            value = current[i]
            column.append(None if value is None else round(value * scale, 1))
            out[metric][node] = column
    return safe_json(out)


# ---------------------------------------------------------------- the page's parts


def _silence_reasons(liveness: str, age: float | None) -> list[str]:
    if liveness == "warn":
        return [f"silent {age:.0f}s (suspected)"]
    if liveness == "bad":
        return [f"silent {age:.0f}s"]
    if liveness == "idle":
        return ["never reported"]
    return []


@dataclass(slots=True)
class NodeStates:
    """Every node judged now, without sparklines: what both Overview layouts start from."""

    cards: list[NodeCard]
    current: dict[str, NodeNow]  # per node: mean util, hottest GPU, memory used
    counts: dict[str, int]  # nodes per level
    gpus_total: int = 0
    gpus_bad: int = 0
    gpus_warn: int = 0

    @property
    def nodes_total(self) -> int:
        return len(self.cards)


def node_states(
    *,
    caches: DashboardCaches,
    session: Session,
    store: SeriesStore,
    now: float,
    suspect_after: float,
    confirm_after: float,
    incident_tiers_by_node: dict[str, list[str]] | None = None,
) -> NodeStates:
    """Every node (registered or only streaming) with its GPUs' live state, sorted by name."""
    live = live_gpus(caches, store)
    tiers_by_node = incident_tiers_by_node or {}
    # Two columns, not the ORM rows: building a few hundred Node objects (fingerprint JSON and
    # all) per render was a visible share of the page.
    nodes = session.exec(select(Node.name, Node.last_seen_at).order_by(Node.name)).all()
    known = {name for name, _ in nodes}
    states = NodeStates(cards=[], current={}, counts={"ok": 0, "warn": 0, "bad": 0, "idle": 0})
    # Nodes that stream samples but were never registered still deserve a card.
    names = sorted(known | set(live))
    last_seen = dict(nodes)
    for name in names:
        gpus = live.get(name, [])
        seen = last_seen.get(name)
        age = None if seen is None else max(0.0, now - seen.timestamp())
        liveness = liveness_level(age, suspect_after=suspect_after, confirm_after=confirm_after)
        reasons = _silence_reasons(liveness, age)
        gpu_levels = []
        for gpu in gpus:
            level = gpu.level
            gpu_levels.append(level)
            states.gpus_total += 1
            if level == "bad":
                states.gpus_bad += 1
                reasons.append(f"GPU {gpu.index}: " + ", ".join(gpu.reasons))
            elif level == "warn":
                states.gpus_warn += 1
                reasons.append(f"GPU {gpu.index}: " + ", ".join(gpu.reasons))
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
        states.counts[level] += 1
        util, temp, mem = node_aggregates(gpus)
        states.current[name] = (util, temp, mem)
        states.cards.append(
            NodeCard(
                name=name,
                level=level,
                reasons=reasons,
                last_seen_age=age,
                gpus=gpus,
                util=util,
                temp=temp,
                mem=mem,
                incident_tiers=tiers,
            )
        )
    return states


def overview_health(
    *,
    caches: DashboardCaches,
    session: Session,
    store: SeriesStore,
    now: float,
    suspect_after: float,
    confirm_after: float,
    incident_tiers_by_node: dict[str, list[str]] | None = None,
) -> OverviewHealth:
    """Every node with its GPUs' live state and 30-minute sparklines (the node cards)."""
    states = node_states(
        caches=caches,
        session=session,
        store=store,
        now=now,
        suspect_after=suspect_after,
        confirm_after=confirm_after,
        incident_tiers_by_node=incident_tiers_by_node,
    )
    sparks = rollup_sparks_cached(caches, session, now=now)
    tail = record_tail(caches, store, now, states.current)
    return OverviewHealth(
        nodes=states.cards,
        counts=states.counts,
        gpus_total=states.gpus_total,
        gpus_bad=states.gpus_bad,
        gpus_warn=states.gpus_warn,
        sparklines=sparkline_blob(sparks, tail, states.current, now=now),
    )


def job_rows(
    *,
    session: Session,
    now: float,
    suspect_after: float,
    confirm_after: float,
    safe_mode_jobs: set[str] | None = None,
    switches: dict[str, Switches] | None = None,
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
        sw = (switches or {}).get(job.name, Switches())
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
                dry_run=sw.dry_run,
                hands_off=sw.hands_off,
            )
        )
    return rows
