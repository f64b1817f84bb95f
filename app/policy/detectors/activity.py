"""Trainer and rollout activity: a trainer idle in its active phase, a rollout that stalled."""

from __future__ import annotations

from collections import defaultdict

from app.policy.detectors.base import (
    Detector,
    ParticipantSeries,
    StartupGrace,
    breach_run,
    participant_subject,
)
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, cap_points
from app.policy.world import ParticipantView, Threshold, World
from app.series.store import Point, SeriesKey
from recovery.protocol import metric_names as m


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
    clock starts no earlier than the moment the participant entered the active phase. A trainer
    in its start-up grace (loading, compiling: :class:`StartupGrace`) is not judged.
    """

    metrics = (m.GPU_UTILIZATION_RATIO,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._phases = _PhaseTracker()
        self.startup = StartupGrace(policy)
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
        roles, active, timeout = cfg.roles, cfg.active_phases, cfg.idle_timeout_seconds
        phase_since_of, check, now = self._phases.since, self.startup.check, world.now
        under_way, start_phases = self.startup.under_way, self.startup.phases
        for p in world.participants:
            if p.role not in roles:
                continue
            phase_since = phase_since_of(p, now)
            if (under_way or p.phase in start_phases) and check(p, now) is not None:
                continue  # still starting
            if p.phase not in active or now - phase_since < timeout:
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
    a request): normal. Only a missing heartbeat after the stall makes it a fault. A rollout in
    its start-up grace (an engine loading and compiling: :class:`StartupGrace`) is not judged.
    """

    lookups = (m.ROLLOUT_TOKENS_PER_SECOND,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.startup = StartupGrace(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.rollout
        suspect = self.policy.detection.heartbeat.suspect_seconds
        roles, finished = cfg.roles, self.policy.detection.heartbeat.finished_phases
        check, now = self.startup.check, world.now  # read once: the loop runs per participant
        under_way, start_phases = self.startup.under_way, self.startup.phases
        out: list[FaultSignal] = []
        for p in world.participants:
            if p.role not in roles or p.phase in finished:
                continue
            if (under_way or p.phase in start_phases) and check(p, now) is not None:
                continue  # still starting (one overdue is the heartbeat detector's)
            hb_age = world.heartbeat_silence(p)  # from its node's return when later
            if hb_age < suspect:
                continue  # alive: zero throughput alone is not a fault
            node_seen = world.node_last_seen.get(p.node)
            if node_seen is not None and world.now - node_seen >= suspect:
                continue  # the whole node is quiet: the node detector's case
            keys = self._throughput.of(world, p.key)  # only read when a heartbeat is late
            if not keys:
                continue
            key = keys[-1]
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
