"""Stragglers: a participant far slower than its peers (``straggler``; light, no action).

What NVIDIA's resiliency extension and DLRover call straggler detection, on the figures the
agents already send: a rollout whose token throughput stays below ``throughput_ratio`` x the
median of its peers (the other rollouts of its job and role), or a trainer rank whose step time
stays above ``step_time_ratio`` x its peers' median, for ``sustain_seconds``, while at least
``min_peers`` peers report a figure (``detection.straggler`` in policy.yaml says why each
default).

Relative, never absolute: a slow but uniform fleet (a smaller GPU, a longer prompt mix) has no
straggler, since every participant sits at its peers' median. The median is that of the others,
the participant itself left out, so that in a small group the straggler does not drag its own
reference down. A rollout at zero tokens/s is not slow but stalled (waiting on a tool, or dead):
the rollout stall and engine detectors judge it, and it is no peer either.

A trainer's figure is its own ``train_step_seconds`` when it reports one (the job's per-rank
measure: in lock-step data parallelism every rank waits in the same all-reduce, so only a
per-rank compute time tells the slow one), otherwise its pace: the median of its last
``pace_steps`` step times, as its ``train_step`` samples show the step move (ranks that step
independently). A trainer whose step stopped is not slow but hung or paused (``train_hang``,
a weight sync): its pace is not judged then.

Cost: one pass over the figures of the tick (O(participants), no label parsing: the series →
participant map is kept while the store's series do not change); step advances come from the
snapshot's CHANGED filter, so a tick touches only the trainers whose step moved; per group one
sort, and only the slow end of it is compared with its peer median.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

from app.ingest.series_store import SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import Detector, ParticipantKey, ParticipantSeries, subject_of
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import CHANGED, World


@dataclass(slots=True)
class _Group:
    """The figures of one (job, role) on this tick, in parallel lists.

    Parallel lists of references to values the store already holds, not an object per
    participant: thousands of objects alive through the tick would be promoted by the garbage
    collector and bring on full collections over the whole series store."""

    keys: list[SeriesKey] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    owners: set[ParticipantKey] = field(default_factory=set)
    paced: set[int] = field(default_factory=set)  # indices whose figure is a trainer's pace

    def add(self, pkey: ParticipantKey, key: SeriesKey, value: float, *, pace: bool) -> None:
        if pkey in self.owners:
            return  # one figure a participant: its own step time before its pace
        self.owners.add(pkey)
        if pace:
            self.paced.add(len(self.values))
        self.keys.append(key)
        self.values.append(value)


@dataclass(slots=True)
class _Pace:
    """A trainer's step as the policy saw it move, and its recent seconds per step."""

    step: int
    key: SeriesKey
    seen_at: float  # sample time of the newest step change (or of the first sighting)
    watched: bool = False  # seen_at is a step change we watched (not the first sighting)
    per_step: deque[float] = field(default_factory=deque)
    figure: float | None = None  # median of per_step once it holds pace_steps values


# A pace not moved for this long belongs to a participant gone (or a job stopped): forgotten.
_PACE_FORGET_SECONDS = 900.0


class StragglerDetector(Detector):
    """See the module docstring."""

    # train_step: only the series whose value moved since the last tick come (a step advance).
    metrics = (m.TRAIN_STEP,)
    filters = {m.TRAIN_STEP: CHANGED}
    # Read in place every tick (World.rings), never snapshotted as lists of points.
    lookups = (m.ROLLOUT_TOKENS_PER_SECOND, m.TRAIN_STEP_SECONDS)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._step_seconds = ParticipantSeries(m.TRAIN_STEP_SECONDS)
        self._steps = ParticipantSeries(m.TRAIN_STEP)
        self._paces: dict[ParticipantKey, _Pace] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        det = self.policy.detection
        rollouts = self._series_figures(world, self._throughput, det.rollout.roles)
        trainers = self._series_figures(world, self._step_seconds, det.trainer.roles)
        self._watch_steps(world, det.trainer.roles)
        self._add_paces(world, trainers)
        out: list[FaultSignal] = []
        for group in rollouts.values():
            out.extend(self._judge(world, group, slow_is_low=True))
        for group in trainers.values():
            out.extend(self._judge(world, group, slow_is_low=False))
        return out

    def _series_figures(
        self, world: World, series: ParticipantSeries, roles: tuple[str, ...]
    ) -> dict[tuple[str, str], _Group]:
        """Fresh, positive figures of one metric, grouped by (job, role)."""
        oldest = world.now - self.policy.detection.stale_sample_seconds
        groups: dict[tuple[str, str], _Group] = {}
        # This loop runs over every rollout each tick: no key hashed, nothing allocated per
        # series, the cheap tests first.
        for job_role, rings in series.rings(world, roles).items():
            group = groups[job_role] = _Group()
            keys, values, owners = group.keys, group.values, group.owners
            for points, key, pkey in rings:
                if points:
                    ts, value = points[-1]
                    if value > 0 and ts >= oldest:  # else stalled or silent: no figure, no peer
                        keys.append(key)
                        values.append(value)
                        owners.add(pkey)
        return groups

    def _watch_steps(self, world: World, roles: tuple[str, ...]) -> None:
        """Each trainer's seconds per step, from the step advances of this tick only."""
        want = self.policy.detection.straggler.pace_steps
        owners = self._steps.owners(world)
        for key, point in world.series(m.TRAIN_STEP):
            pkey = owners.get(key)
            if pkey is None or pkey[1] not in roles:
                continue
            step = int(point.value)
            pace = self._paces.get(pkey)
            if pace is None or step < pace.step:  # new, or restored from an older checkpoint
                self._paces[pkey] = _Pace(step, key, point.ts, per_step=deque(maxlen=want))
                continue
            if step == pace.step or point.ts <= pace.seen_at:
                continue
            if pace.watched:  # a whole step (or several) watched from its start
                pace.per_step.append((point.ts - pace.seen_at) / (step - pace.step))
                if len(pace.per_step) == want:
                    pace.figure = statistics.median(pace.per_step)
            pace.step, pace.key, pace.seen_at, pace.watched = step, key, point.ts, True

    def _add_paces(self, world: World, groups: dict[tuple[str, str], _Group]) -> None:
        """A trainer that reports no step time of its own gets its pace as its figure: the
        median of its last ``pace_steps`` step times (a long-tail step or a restart's gap does
        not move it), while its step keeps moving at that pace."""
        stale = self.policy.detection.stale_sample_seconds
        gone: list[ParticipantKey] = []
        for pkey, pace in self._paces.items():
            quiet = world.now - pace.seen_at
            if quiet > _PACE_FORGET_SECONDS:
                gone.append(pkey)
            elif pace.figure is not None and quiet <= max(stale, 3 * pace.figure):
                # (a pace that stopped is a hang or a pause, not slowness: not judged)
                job_role = (pkey[0], pkey[1])
                group = groups.get(job_role)
                if group is None:
                    group = groups[job_role] = _Group()
                group.add(pkey, pace.key, pace.figure, pace=True)
        for pkey in gone:
            del self._paces[pkey]

    def _judge(self, world: World, group: _Group, *, slow_is_low: bool) -> list[FaultSignal]:
        cfg = self.policy.detection.straggler
        values = group.values
        peers = len(values) - 1
        if peers < cfg.min_peers:
            return []
        ratio = cfg.throughput_ratio if slow_is_low else cfg.step_time_ratio
        ranked = sorted(values)
        # Leaving out one value moves the median by at most one place: a participant beyond
        # ratio x the most lenient of those medians is checked exactly, the others not at all.
        lenient = ratio * _median_without(ranked, 0 if slow_is_low else len(ranked) - 1)
        out: list[FaultSignal] = []
        for i, value in enumerate(values):
            if (value >= lenient) if slow_is_low else (value <= lenient):
                continue
            median = _median_without(ranked, bisect.bisect_left(ranked, value))
            limit = ratio * median
            if (value >= limit) if slow_is_low else (value <= limit):
                continue
            key = group.keys[i]
            since = self.sticky_since(key, world.now, open_ended=True)
            if world.now - since >= cfg.sustain_seconds:
                paced = i in group.paced
                out.append(self._signal(world, key, value, paced, median, limit, peers, since))
        return out

    def _signal(
        self,
        world: World,
        key: SeriesKey,
        value: float,
        paced: bool,
        median: float,
        limit: float,
        peers: int,
        since: float,
    ) -> FaultSignal:
        sub = subject_of(key)
        cfg = self.policy.detection.straggler
        held = f"for {world.now - since:.0f}s; {peers} peers"
        metric = key.name
        if metric == m.ROLLOUT_TOKENS_PER_SECOND:
            detail = (
                f"{sub.role}-{sub.rank} generates {value:.0f} tokens/s vs its peers' median "
                f"{median:.0f} ({value / median:.2f}x; a straggler below "
                f"{cfg.throughput_ratio:g}x) {held}"
            )
        else:
            source = (
                f"its pace: the median of its last {cfg.pace_steps} steps"
                if paced
                else "train_step_seconds"
            )
            detail = (
                f"{sub.role}-{sub.rank} takes {value:.1f}s a step ({source}) vs its peers' "
                f"median {median:.1f}s ({value / median:.2f}x; a straggler above "
                f"{cfg.step_time_ratio:g}x) {held}"
            )
        evidence = Evidence(
            metric=metric,
            values=cap_points([(p.ts, p.value) for p in world.store.since(key, since)]),
            window_seconds=cfg.sustain_seconds,
            threshold=round(limit, 3),
            detail=detail,
        )
        return self.signal(
            world,
            FaultKind.STRAGGLER,
            sub,
            evidence,
            since=since,
            figure=round(value, 3),
            peer_median=round(median, 3),
            peers=peers,
        )


def _median_without(values: list[float], i: int) -> float:
    """The median of ``values`` (sorted) without its ``i``-th element, in O(1)."""
    n = len(values) - 1

    def at(j: int) -> float:
        return values[j] if j < i else values[j + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2

