"""Detectors: turn the series window and the participant table into fault signals.

Each detector is small and answers one question. A detector emits a signal on every tick that
its condition holds (the engine groups repeated signals into one incident and resolves it once
the signal has been absent for the quiet period). Time always comes from ``world.now``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.ingest.series_store import Point, SeriesKey
from app.policy import metric_names as m
from app.policy.policy_file import GoldenMetricRule, Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier, cap_points
from app.policy.world import CHANGED, ParticipantView, Threshold, World


def subject_of(key: SeriesKey) -> Subject:
    rank = key.label(m.LABEL_RANK)
    return Subject(
        node=key.node,
        job=key.label(m.LABEL_JOB),
        role=key.label(m.LABEL_ROLE),
        rank=int(rank) if rank is not None and rank.lstrip("-").isdigit() else None,
        gpu=key.label(m.LABEL_GPU),
    )


def participant_subject(p: ParticipantView) -> Subject:
    return Subject(node=p.node, job=p.job, role=p.role, rank=p.rank)


class Detector:
    """Base class: ``detect`` returns the signals whose condition holds at ``world.now``."""

    #: metric names this detector reads from ``world.latest`` every tick
    metrics: tuple[str, ...] = ()
    #: per name: which series the snapshot keeps (a predicate on the newest value, or CHANGED);
    #: a name without a filter comes whole. Filters keep the tick cheap at cluster scale.
    filters: dict[str, object] = {}
    #: names read only on demand (``world.all_series``), never snapshotted
    lookups: tuple[str, ...] = ()

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._since: dict[object, float] = {}
        self._since_now: dict[object, float] = {}

    def run(self, world: World) -> list[FaultSignal]:
        """``detect`` plus bookkeeping: conditions that did not hold this tick are forgotten."""
        self._since_now = {}
        out = self.detect(world)
        self._since = self._since_now
        return out

    def sticky_since(self, ident: object, start: float, *, open_ended: bool) -> float:
        """Keep the start of a condition stable while it lasts.

        Detectors look back over a bounded window; when the condition fills the whole window
        (``open_ended``) its true start lies further back: keep the start seen on earlier ticks,
        so one long breach stays one occurrence instead of a start that moves every tick.
        """
        prev = self._since.get(ident)
        if open_ended and prev is not None and prev <= start:
            start = prev
        self._since_now[ident] = start
        return start

    def tier(self, kind: FaultKind) -> Tier:
        return self.policy.tier_rule(kind).tier

    def signal(
        self,
        world: World,
        kind: FaultKind,
        subject: Subject,
        evidence: Evidence,
        *,
        since: float | None,
        step: int | None = None,
        **extra: object,
    ) -> FaultSignal:
        return FaultSignal(
            kind=kind,
            subject=subject,
            evidence=evidence,
            suggested_tier=self.tier(kind),
            detected_at=world.now,
            since=since,
            step=step,
            extra=dict(extra),
        )

    def detect(self, world: World) -> list[FaultSignal]:  # pragma: no cover - interface
        raise NotImplementedError

    def fresh(self, world: World, point: Point) -> bool:
        return world.now - point.ts <= self.policy.detection.stale_sample_seconds


def at_least_one(value: float) -> bool:
    return value >= 1


AT_LEAST_ONE = Threshold("ge", 1.0)


def breach_run(points: list[Point], breaches: Callable[[float], bool]) -> list[Point]:
    """The newest contiguous run of points that satisfy ``breaches`` (oldest first)."""
    run: list[Point] = []
    for p in reversed(points):
        if not breaches(p.value):
            break
        run.append(p)
    run.reverse()
    return run


class GoldenMetricDetector(Detector):
    """A golden metric above its warning threshold for its breach duration."""

    metrics = (
        m.ROLLOUT_PENDING_RATIO,
        m.ACTOR_SHARD_REBUILD_COUNT_5M,
        m.STATE_LOG_WRITE_LATENCY_MS,
    )

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {
            name: Threshold("ge" if rule.inclusive else "gt", rule.warning)
            for name, rule in policy.golden_metrics.items()
        }

    def detect(self, world: World) -> list[FaultSignal]:
        out: list[FaultSignal] = []
        for name, rule in self.policy.golden_metrics.items():
            for key, latest in world.series(name):
                if not self.fresh(world, latest) or not rule.breaches(latest.value):
                    continue
                sig = self._judge(world, key, rule)
                if sig is not None:
                    out.append(sig)
        return out

    def _judge(self, world: World, key: SeriesKey, rule: GoldenMetricRule) -> FaultSignal | None:
        lookback = rule.breach_seconds + self.policy.detection.stale_sample_seconds
        points = world.store.since(key, world.now - lookback)
        run = breach_run(points, rule.breaches)
        if not run:
            return None
        start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
        covered = len(run) < len(points) or start <= world.now - rule.breach_seconds
        if not covered or world.now - start < rule.breach_seconds:
            return None
        evidence = Evidence(
            metric=key.name,
            values=cap_points([(p.ts, p.value) for p in run]),
            window_seconds=rule.breach_seconds,
            threshold=rule.warning,
            detail=f"{key.name} {'>=' if rule.inclusive else '>'} {rule.warning} "
            f"for {world.now - start:.0f}s (healthy {rule.healthy})",
        )
        return self.signal(world, rule.kind, subject_of(key), evidence, since=start)


class _PhaseTracker:
    """Since when each participant has been in its current phase (as far as we have seen)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str, int], tuple[str, float]] = {}

    def since(self, p: ParticipantView, now: float) -> float:
        prev = self._seen.get(p.key)
        if prev is None or prev[0] != p.phase:
            self._seen[p.key] = (p.phase, now)
            return now
        return prev[1]


class TrainerIdleDetector(Detector):
    """A trainer in its TRAIN phase whose node's GPUs did nothing for ``idle_timeout_seconds``.

    Idle time outside the active phases (weight sync, context switch) never counts: the idle
    clock starts no earlier than the moment the participant entered the active phase.
    """

    metrics = (m.GPU_UTILIZATION_RATIO,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._phases = _PhaseTracker()
        idle = policy.detection.trainer.idle_utilization_ratio
        self.filters = {m.GPU_UTILIZATION_RATIO: Threshold("le", idle)}  # only idle GPUs come

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.trainer
        by_node: dict[str, list[tuple[SeriesKey, Point]]] = defaultdict(list)
        for key, point in world.series(m.GPU_UTILIZATION_RATIO):
            by_node[key.node].append((key, point))
        idle_trainers: dict[tuple[str, str], list[tuple[ParticipantView, float]]] = defaultdict(
            list
        )
        for p in world.participants:
            if p.role not in cfg.roles:
                continue
            phase_since = self._phases.since(p, world.now)
            if p.phase not in cfg.active_phases:
                continue
            if world.now - phase_since < cfg.idle_timeout_seconds:
                continue
            idle_trainers[(p.job, p.node)].append((p, phase_since))
        out: list[FaultSignal] = []
        for (job, node), members in sorted(idle_trainers.items()):
            gpus = by_node.get(node, [])
            if (
                not gpus
                or any(pt.value > cfg.idle_utilization_ratio for _, pt in gpus)
                or len(gpus) < world.series_count(m.GPU_UTILIZATION_RATIO, node)
            ):
                continue  # some GPU of the node is busy
            if not all(self.fresh(world, pt) for _, pt in gpus):
                continue  # the node went quiet: that is the silence detector's case
            phase_since = max(since for _, since in members)
            idle_since = self._idle_since(world, gpus, phase_since)
            if idle_since is None or world.now - idle_since < cfg.idle_timeout_seconds:
                continue
            values = world.store.since(gpus[0][0], idle_since)
            evidence = Evidence(
                metric=m.GPU_UTILIZATION_RATIO,
                values=cap_points([(pt.ts, pt.value) for pt in values]),
                window_seconds=cfg.idle_timeout_seconds,
                threshold=cfg.idle_utilization_ratio,
                detail=f"{len(gpus)} GPU(s) at or below {cfg.idle_utilization_ratio:.0%} for "
                f"{world.now - idle_since:.0f}s while in {members[0][0].phase}",
            )
            ranks = sorted(p.rank for p, _ in members)
            out.append(
                self.signal(
                    world,
                    FaultKind.TRAINER_IDLE,
                    Subject(node=node, job=job, role=members[0][0].role),
                    evidence,
                    since=idle_since,
                    step=max(p.step for p, _ in members),
                    ranks=ranks,
                )
            )
        return out

    def _idle_since(
        self, world: World, gpus: list[tuple[SeriesKey, Point]], phase_since: float
    ) -> float | None:
        threshold = self.policy.detection.trainer.idle_utilization_ratio
        start = phase_since
        for key, _ in gpus:
            points = world.store.since(key, phase_since)
            if not points:
                return None
            run = breach_run(points, lambda v: v <= threshold)
            if len(run) == len(points):
                # Idle for all we have since the phase began; data starting late caps it.
                start = max(start, points[0].ts if points[0].ts > phase_since + 2 else phase_since)
            elif run:
                start = max(start, run[0].ts)
            else:
                return None  # busy at its newest sample
        return start


class RolloutStallDetector(Detector):
    """Zero token throughput for ``stall_timeout_seconds``, then a heartbeat check.

    A rollout that generates nothing but keeps its heartbeat is waiting (on a tool, a sandbox,
    a request): normal. Only a missing heartbeat after the stall makes it a fault.
    """

    lookups = (m.ROLLOUT_TOKENS_PER_SECOND,)

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.rollout
        suspect = self.policy.detection.heartbeat.suspect_seconds
        throughput: dict[tuple[str, str, int], SeriesKey] | None = None
        out: list[FaultSignal] = []
        for p in world.participants:
            if (
                p.role not in cfg.roles
                or p.phase in self.policy.detection.heartbeat.finished_phases
            ):
                continue
            hb_age = world.now - p.last_heartbeat_ts
            if hb_age < suspect:
                continue  # alive: zero throughput alone is not a fault
            node_seen = world.node_last_seen.get(p.node)
            if node_seen is not None and world.now - node_seen >= suspect:
                continue  # the whole node is quiet: the node detector's case
            if throughput is None:  # only built when a rollout's heartbeat is late
                throughput = self._throughput_keys(world)
            key = throughput.get(p.key)
            if key is None:
                continue
            stall_since = self._stall_since(world, key)
            if stall_since is not None:
                stall_since = self.sticky_since(key, stall_since, open_ended=True)
            if stall_since is None or world.now - stall_since < cfg.stall_timeout_seconds:
                continue
            points = world.store.since(key, stall_since - 1)
            evidence = Evidence(
                metric=m.ROLLOUT_TOKENS_PER_SECOND,
                values=cap_points([(pt.ts, pt.value) for pt in points]),
                window_seconds=cfg.stall_timeout_seconds,
                threshold=0.0,
                detail=f"no tokens for {world.now - stall_since:.0f}s and heartbeat silent "
                f"for {hb_age:.0f}s (suspect after {suspect:.0f}s)",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ROLLOUT_DOWN,
                    participant_subject(p),
                    evidence,
                    since=stall_since,
                    step=p.step,
                    heartbeat_age=round(hb_age, 3),
                )
            )
        return out

    def _throughput_keys(self, world: World) -> dict[tuple[str, str, int], SeriesKey]:
        # Kept while the number of series is unchanged: parsing every key each tick would cost
        # more than the rest of the tick at cluster scale.
        size = len(world.store)
        cached = getattr(self, "_tp_cache", None)
        if cached is not None and cached[0] == size:
            return cached[1]  # type: ignore[no-any-return]
        keys: dict[tuple[str, str, int], SeriesKey] = {}
        for k, _ in world.all_series(m.ROLLOUT_TOKENS_PER_SECOND):
            sub = subject_of(k)
            if sub.job is not None and sub.role is not None and sub.rank is not None:
                keys[(sub.job, sub.role, sub.rank)] = k
        self._tp_cache = (size, keys)
        return keys

    def _stall_since(self, world: World, key: SeriesKey) -> float | None:
        window = self.policy.detection.rollout.stall_timeout_seconds * 2
        points = world.store.since(key, world.now - window)
        if not points:
            latest = world.store.latest(key)
            return latest.ts if latest is not None else None
        run = breach_run(points, lambda v: v <= 0.0)
        if not run:
            # Last sample positive but nothing since: the stall began after that sample.
            return points[-1].ts if not self.fresh(world, points[-1]) else None
        if len(run) == len(points):
            return points[0].ts
        return run[0].ts


class HeartbeatDetector(Detector):
    """Two-level loss: silent ``suspect_seconds`` → suspected; still silent after a further
    ``confirm_seconds`` → confirmed (a signal). A participant that comes back clears itself.

    A participant whose phase is one of ``exited_phases`` (its launcher saw the process exit)
    is lost at once: nothing is left to come back.

    Participants on a node that is silent as a whole are the node detector's business.

    A Ray actor (agent ``--ray``) that Ray reports dead or restarting comes in phase
    ``RAY_DEAD`` / ``RAY_RESTARTING`` (exited phases too); Ray's death cause, sent as
    ``ray_actor_dead{reason}``, goes into the evidence.
    """

    lookups = (m.RAY_ACTOR_DEAD,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.suspected: list[ParticipantView] = []

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.heartbeat
        out: list[FaultSignal] = []
        suspected: list[ParticipantView] = []
        for p in world.participants:
            if p.phase in cfg.finished_phases:
                continue
            age = world.now - p.last_heartbeat_ts
            exited = p.phase in cfg.exited_phases
            if age < cfg.suspect_seconds and not exited:
                continue
            node_seen = world.node_last_seen.get(p.node)
            if node_seen is not None and world.now - node_seen >= cfg.suspect_seconds:
                continue
            if exited:
                out.append(self._exited(world, p))
                continue
            if age < cfg.suspect_seconds + cfg.confirm_seconds:
                suspected.append(p)
                continue
            evidence = Evidence(
                metric=None,
                values=((p.last_heartbeat_ts, 0.0),),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=cfg.suspect_seconds,
                detail=f"heartbeat of {p.role}-{p.rank} silent for {age:.0f}s "
                f"(suspected at {cfg.suspect_seconds:.0f}s, confirmed after a further "
                f"{cfg.confirm_seconds:.0f}s) while its node still reports",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.HEARTBEAT_LOST,
                    participant_subject(p),
                    evidence,
                    since=p.last_heartbeat_ts,
                    step=p.step,
                )
            )
        self.suspected = suspected
        return out

    def _exited(self, world: World, p: ParticipantView) -> FaultSignal:
        ray_cause = self._ray_cause(world, p) if p.phase.startswith("RAY_") else None
        if ray_cause is not None:
            detail = (
                f"{p.role}-{p.rank} is {p.phase.removeprefix('RAY_')} in Ray "
                f"(reported {world.now - p.last_heartbeat_ts:.0f}s ago): {ray_cause}"
            )
        else:
            detail = (
                f"{p.role}-{p.rank} exited (phase {p.phase}, reported by its launcher "
                f"{world.now - p.last_heartbeat_ts:.0f}s ago) while its node still reports"
            )
        evidence = Evidence(
            metric=None,
            values=((p.last_heartbeat_ts, 0.0),),
            window_seconds=0.0,
            threshold=None,
            detail=detail,
        )
        return self.signal(
            world,
            FaultKind.HEARTBEAT_LOST,
            participant_subject(p),
            evidence,
            since=p.last_heartbeat_ts,
            step=p.step,
            exited=True,
        )


    @staticmethod
    def _ray_cause(world: World, p: ParticipantView) -> str | None:
        """Ray's death cause of the participant's actor (newest ``ray_actor_dead`` series)."""
        best: tuple[float, str] | None = None
        for key, point in world.all_series(m.RAY_ACTOR_DEAD):
            if (key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK)) != (
                p.job,
                p.role,
                str(p.rank),
            ):
                continue
            pid = f", pid {int(point.value)}" if point.value > 0 else ""
            text = f"Ray death cause {key.label('reason')}{pid}"
            if best is None or point.ts > best[0]:
                best = (point.ts, text)
        return best[1] if best is not None else "Ray gave no death cause"


class NodeSilenceDetector(Detector):
    """A node whose agent sent nothing: suspected, then confirmed; several at once → heavy."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.suspected: list[str] = []

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.heartbeat
        confirmed: list[tuple[str, float]] = []
        suspected: list[str] = []
        for node, seen in sorted(world.node_last_seen.items()):
            age = world.now - seen
            if age < cfg.suspect_seconds:
                continue
            if age < cfg.suspect_seconds + cfg.confirm_seconds:
                suspected.append(node)
            else:
                confirmed.append((node, seen))
        self.suspected = suspected
        if not confirmed:
            return []
        out: list[FaultSignal] = []
        lost_by_job: dict[str | None, list[tuple[str, float]]] = defaultdict(list)
        for node, seen in confirmed:
            jobs: list[str | None] = list(world.jobs_on_node(node)) or [None]
            for job in jobs:
                lost_by_job[job].append((node, seen))
        several = self.policy.detection.nodes.several_lost_min
        grouped_nodes: set[str] = set()
        for job, lost in sorted(lost_by_job.items(), key=lambda kv: kv[0] or ""):
            if len(lost) < several:
                continue
            nodes = sorted(n for n, _ in lost)
            grouped_nodes.update(nodes)
            # The fault exists once the n-th node is confirmed: since = the n-th latest silence.
            since = sorted(seen for _, seen in lost)[several - 1]
            evidence = Evidence(
                metric=None,
                values=tuple(sorted((seen, 0.0) for _, seen in lost)),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=float(several),
                detail=f"{len(nodes)} nodes silent: {', '.join(nodes)}",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODES_LOST,
                    Subject(job=job),
                    evidence,
                    since=since,
                    nodes=nodes,
                )
            )
        for node, seen in confirmed:
            if node in grouped_nodes:
                continue
            evidence = Evidence(
                metric=None,
                values=((seen, 0.0),),
                window_seconds=cfg.suspect_seconds + cfg.confirm_seconds,
                threshold=cfg.suspect_seconds,
                detail=f"node {node} sent nothing for {world.now - seen:.0f}s",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODE_SILENT,
                    Subject(node=node),
                    evidence,
                    since=seen,
                    jobs=world.jobs_on_node(node),
                )
            )
        return out


@dataclass(slots=True)
class _Episode:
    first_ts: float
    last_ts: float
    increase: float


class _CounterWatch:
    """Finds increases of cumulative counters between ticks.

    The first value of a series is a baseline, unless its node was already reporting before
    (then a series that appears with a positive value is an increase from zero).
    """

    def __init__(self) -> None:
        self._last: dict[SeriesKey, tuple[float, float]] = {}
        self.episodes: dict[SeriesKey, _Episode] = {}

    def observe(self, key: SeriesKey, point: Point, *, node_known: bool, hold: float) -> float:
        prev = self._last.get(key)
        self._last[key] = (point.ts, point.value)
        if prev is None:
            increase = point.value if node_known and point.value > 0 else 0.0
        elif point.ts <= prev[0]:
            return 0.0
        else:
            delta = point.value - prev[1]
            increase = delta if delta >= 0 else point.value  # reset: count from zero
        if increase > 0:
            ep = self.episodes.get(key)
            if ep is None or point.ts - ep.last_ts > hold:
                self.episodes[key] = _Episode(point.ts, point.ts, increase)
            else:
                ep.last_ts = point.ts
                ep.increase += increase
        return increase

    def episodes_of(
        self,
        world: World,
        name: str,
        nodes: _NodeMemory,
        hold: float,
        *,
        on_increase: Callable[[SeriesKey, float], None] | None = None,
    ) -> list[tuple[SeriesKey, _Episode]]:
        """Observe the series of ``name`` that changed this tick; return the live episodes."""
        for key, point in world.series(name):
            inc = self.observe(key, point, node_known=nodes.known(key.node), hold=hold)
            if inc > 0 and on_increase is not None:
                on_increase(key, inc)
        out = []
        for key in [k for k in self.episodes if k.name == name]:
            ep = self.active(key, world.now, hold)
            if ep is not None:
                out.append((key, ep))
        return out

    def active(self, key: SeriesKey, now: float, hold: float) -> _Episode | None:
        ep = self.episodes.get(key)
        if ep is None:
            return None
        if now - ep.last_ts > hold:
            del self.episodes[key]
            return None
        return ep


class _NodeMemory:
    """Which nodes had reported before this tick (see _CounterWatch)."""

    def __init__(self) -> None:
        self._known: set[str] = set()
        self._pending: set[str] = set()

    def known(self, node: str) -> bool:
        self._pending.add(node)
        return node in self._known

    def commit(self, world: World) -> None:
        self._known |= self._pending
        self._known.update(world.node_last_seen)
        self._pending.clear()


class GpuHealthDetector(Detector):
    """New critical XIDs, uncorrectable ECC increases, row-remap failure, sustained throttling,
    GPU lost from the bus."""

    metrics = (
        m.GPU_XID_CRITICAL_EVENTS_TOTAL,
        m.GPU_ECC_UNCORRECTED_TOTAL,
        m.GPU_REMAPPED_ROWS_FAILURE,
        m.GPU_THROTTLE_THERMAL,
        m.GPU_THROTTLE_POWER,
        m.GPU_LOST,
    )
    lookups = (m.GPU_XID_LAST_CODE,)
    filters = {
        m.GPU_XID_CRITICAL_EVENTS_TOTAL: CHANGED,
        m.GPU_ECC_UNCORRECTED_TOTAL: CHANGED,
        m.GPU_REMAPPED_ROWS_FAILURE: AT_LEAST_ONE,
        m.GPU_THROTTLE_THERMAL: AT_LEAST_ONE,
        m.GPU_THROTTLE_POWER: AT_LEAST_ONE,
        m.GPU_LOST: AT_LEAST_ONE,
    }

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = _CounterWatch()
        self._nodes = _NodeMemory()

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.gpu
        out: list[FaultSignal] = []
        xid_codes: dict[tuple[str, str | None], float] | None = None
        for kind, name in (
            (FaultKind.GPU_XID, m.GPU_XID_CRITICAL_EVENTS_TOTAL),
            (FaultKind.GPU_ECC_UNCORRECTABLE, m.GPU_ECC_UNCORRECTED_TOTAL),
        ):
            for key, ep in self._counters.episodes_of(
                world, name, self._nodes, cfg.event_hold_seconds
            ):
                extra: dict[str, Any] = {"increase": ep.increase, "newest_at": ep.last_ts}
                detail = f"{name} rose by {ep.increase:g}"
                if kind is FaultKind.GPU_XID:
                    if xid_codes is None:
                        xid_codes = {
                            (k.node, k.label(m.LABEL_GPU)): pt.value
                            for k, pt in world.all_series(m.GPU_XID_LAST_CODE)
                        }
                    code = xid_codes.get((key.node, key.label(m.LABEL_GPU)))
                    if code is not None:
                        extra["xid"] = int(code)
                        detail += f" (newest XID {int(code)})"
                evidence = Evidence(
                    metric=name,
                    values=((ep.first_ts, ep.increase),),
                    window_seconds=cfg.event_hold_seconds,
                    threshold=0.0,
                    detail=detail,
                )
                out.append(
                    self.signal(world, kind, subject_of(key), evidence, since=ep.first_ts, **extra)
                )
        for name, kind, detail in (
            (
                m.GPU_REMAPPED_ROWS_FAILURE,
                FaultKind.GPU_ROW_REMAP_FAILURE,
                "row remapping failed: the GPU needs replacing",
            ),
            (m.GPU_LOST, FaultKind.GPU_LOST, "GPU fell off the bus"),
        ):
            for key, point in world.series(name):
                if point.value >= 1 and self.fresh(world, point):
                    out.append(self._flag(world, key, point, kind, detail))
        out.extend(self._throttling(world))
        self._nodes.commit(world)
        return out

    def _flag(
        self, world: World, key: SeriesKey, point: Point, kind: FaultKind, detail: str
    ) -> FaultSignal:
        run = breach_run(world.store.since(key, world.now - 3600), at_least_one)
        since = run[0].ts if run else point.ts
        evidence = Evidence(metric=key.name, values=((since, 1.0),), threshold=1.0, detail=detail)
        return self.signal(world, kind, subject_of(key), evidence, since=since)

    def _throttling(self, world: World) -> Iterable[FaultSignal]:
        sustain = self.policy.detection.gpu.throttle_sustain_seconds
        seen: set[tuple[str, str | None]] = set()
        for name in (m.GPU_THROTTLE_THERMAL, m.GPU_THROTTLE_POWER):
            for key, point in world.series(name):
                ident = (key.node, key.label(m.LABEL_GPU))
                if ident in seen or point.value < 1 or not self.fresh(world, point):
                    continue
                points = world.store.since(
                    key, world.now - sustain - self.policy.detection.stale_sample_seconds
                )
                run = breach_run(points, lambda v: v >= 1)
                if not run or len(run) == len(points) and run[0].ts > world.now - sustain:
                    continue
                start = self.sticky_since(
                    ("throttle", key), run[0].ts, open_ended=len(run) == len(points)
                )
                if world.now - start < sustain:
                    continue
                seen.add(ident)
                evidence = Evidence(
                    metric=name,
                    values=cap_points([(p.ts, p.value) for p in run]),
                    window_seconds=sustain,
                    threshold=1.0,
                    detail=f"{name} for {world.now - start:.0f}s",
                )
                yield self.signal(
                    world, FaultKind.GPU_THROTTLED, subject_of(key), evidence, since=start
                )


class JobFailureDetector(Detector):
    """Failures the job reports itself: failed train steps (OOM ...), rollout batch timeouts,
    stale actor shards, state-log or checkpoint writes that fail (storage not writable)."""

    metrics = (
        m.TRAIN_STEP_FAILURES_TOTAL,
        m.ROLLOUT_BATCH_TIMEOUTS_TOTAL,
        m.ACTOR_SHARD_STALE,
        m.STATE_LOG_WRITE_ERRORS_TOTAL,
        m.CHECKPOINT_WRITE_ERRORS_TOTAL,
    )
    lookups = (m.TRAIN_LAST_FAILED_STEP, m.TRAIN_STEP)
    filters = {
        m.TRAIN_STEP_FAILURES_TOTAL: CHANGED,
        m.ROLLOUT_BATCH_TIMEOUTS_TOTAL: CHANGED,
        m.STATE_LOG_WRITE_ERRORS_TOTAL: CHANGED,
        m.CHECKPOINT_WRITE_ERRORS_TOTAL: CHANGED,
        m.ACTOR_SHARD_STALE: AT_LEAST_ONE,
    }

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = _CounterWatch()
        self._nodes = _NodeMemory()
        # (job, step) → how many times that step failed: "the same step failing again".
        self.step_failures: dict[tuple[str, int], int] = defaultdict(int)
        self._failed_step: dict[SeriesKey, int | None] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        hold = self.policy.detection.gpu.event_hold_seconds
        out: list[FaultSignal] = []
        steps: dict[tuple[str, str | None, str | None, str | None], float] | None = None

        def on_increase(key: SeriesKey, inc: float) -> None:
            nonlocal steps
            if steps is None:  # read only when a step failed: most ticks never need it
                steps = {self._ident(k): pt.value for k, pt in world.all_series(m.TRAIN_STEP)}
                steps.update(
                    {
                        self._ident(k): pt.value
                        for k, pt in world.all_series(m.TRAIN_LAST_FAILED_STEP)
                    }
                )
            value = steps.get(self._ident(key))
            step = int(value) if value is not None else None
            self._failed_step[key] = step
            job = key.label(m.LABEL_JOB)
            if step is not None and job is not None:
                self.step_failures[(job, step)] += int(max(1, inc))

        for key, ep in self._counters.episodes_of(
            world, m.TRAIN_STEP_FAILURES_TOTAL, self._nodes, hold, on_increase=on_increase
        ):
            step = self._failed_step.get(key)
            job = key.label(m.LABEL_JOB) or ""
            same = self.step_failures.get((job, step), 0) if step is not None else 0
            evidence = Evidence(
                metric=key.name,
                values=((ep.first_ts, ep.increase),),
                window_seconds=hold,
                threshold=0.0,
                detail=f"{int(ep.increase)} failed train step(s), newest at step {step}",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.STEP_FAILED,
                    subject_of(key),
                    evidence,
                    since=ep.first_ts,
                    step=step,
                    same_step_failures=same,
                    newest_at=ep.last_ts,
                )
            )
        for kind, name, window in (
            (FaultKind.ROLLOUT_BATCH_TIMEOUT, m.ROLLOUT_BATCH_TIMEOUTS_TOTAL, hold),
            (
                FaultKind.STORAGE_UNWRITABLE,
                m.STATE_LOG_WRITE_ERRORS_TOTAL,
                self.policy.detection.storage.error_window_seconds,
            ),
            (
                FaultKind.STORAGE_UNWRITABLE,
                m.CHECKPOINT_WRITE_ERRORS_TOTAL,
                self.policy.detection.storage.error_window_seconds,
            ),
        ):
            for key, ep in self._counters.episodes_of(world, name, self._nodes, window):
                evidence = Evidence(
                    metric=name,
                    values=((ep.first_ts, ep.increase),),
                    window_seconds=window,
                    threshold=0.0,
                    detail=f"{name} rose by {ep.increase:g}",
                )
                out.append(
                    self.signal(
                        world,
                        kind,
                        subject_of(key),
                        evidence,
                        since=ep.first_ts,
                        newest_at=ep.last_ts,
                    )
                )
        for key, point in world.series(m.ACTOR_SHARD_STALE):
            if point.value >= 1 and self.fresh(world, point):
                run = breach_run(world.store.since(key, world.now - 3600), at_least_one)
                since = run[0].ts if run else point.ts
                evidence = Evidence(
                    metric=key.name,
                    values=((since, 1.0),),
                    threshold=1.0,
                    detail="actor shard marked stale",
                )
                out.append(
                    self.signal(
                        world, FaultKind.SHARD_STALE, subject_of(key), evidence, since=since
                    )
                )
        self._nodes.commit(world)
        return out

    @staticmethod
    def _ident(key: SeriesKey) -> tuple[str, str | None, str | None, str | None]:
        return (key.node, key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK))


class EnvDriftDetector(Detector):
    """Nodes of one job whose environment fingerprints differ."""

    def detect(self, world: World) -> list[FaultSignal]:
        ignore = set(self.policy.detection.env_drift.ignore_keys)
        nodes_by_job: dict[str, set[str]] = defaultdict(set)
        for p in world.participants:
            nodes_by_job[p.job].add(p.node)
        out: list[FaultSignal] = []
        for job, nodes in sorted(nodes_by_job.items()):
            prints = {
                n: {k: v for k, v in world.fingerprints[n].items() if k not in ignore}
                for n in sorted(nodes)
                if n in world.fingerprints
            }
            if len(prints) < 2:
                continue
            keys = sorted({k for fp in prints.values() for k in fp})
            differing = [k for k in keys if len({fp.get(k) for fp in prints.values()}) > 1]
            if not differing:
                continue
            evidence = Evidence(
                metric=None,
                detail="fingerprints differ in "
                + ", ".join(differing)
                + " across "
                + ", ".join(
                    f"{n}({', '.join(f'{k}={fp.get(k)}' for k in differing)})"
                    for n, fp in prints.items()
                ),
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ENV_DRIFT,
                    Subject(job=job),
                    evidence,
                    since=None,
                    differing_keys=differing,
                    nodes=sorted(prints),
                )
            )
        return out


def default_detectors(policy: Policy) -> list[Detector]:
    from app.policy.hang import TrainHangDetector  # its own module, built on this one
    from app.policy.inference_engines import InferenceEngineDownDetector  # likewise
    from app.policy.ray_nodes import RayNodeDeadDetector  # likewise
    from app.policy.scheduler_nodes import SchedulerNodeDetector  # likewise

    return [
        GoldenMetricDetector(policy),
        TrainerIdleDetector(policy),
        RolloutStallDetector(policy),
        HeartbeatDetector(policy),
        NodeSilenceDetector(policy),
        GpuHealthDetector(policy),
        JobFailureDetector(policy),
        EnvDriftDetector(policy),
        TrainHangDetector(policy),
        InferenceEngineDownDetector(policy),
        SchedulerNodeDetector(policy),
        RayNodeDeadDetector(policy),
    ]
