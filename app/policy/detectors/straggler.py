"""Stragglers: a participant far slower than its peers (``straggler``; light, no action).

A rollout whose token throughput stays below ``throughput_ratio`` x the median of its peers (the
other rollouts of its job and role), or a trainer rank whose step time stays above
``step_time_ratio`` x its peers' median, for ``sustain_seconds``, while at least ``min_peers``
peers report a figure (``detection.straggler`` in policy.yaml). Relative, never absolute: a
uniform fleet has no straggler; the median is the others'. A rollout at zero tokens/s is stalled,
not slow, and no peer; a trainer whose step stopped is hung (``train_hang``), not judged here.
A trainer's figure is its own ``train_step_seconds`` when it reports one (in lock-step data
parallelism only a per-rank compute time tells the slow rank), else its pace: the median of its
last ``pace_steps`` step times as the train-hang detector measures them.

Groups with fewer than ``min_peers`` but at least ``small_group_min_peers`` peers get a stricter
rule: beyond the ratio of *every* peer, peers agreeing within ``small_group_agreement``, fallen
behind its own figure from when it was in line with them, figures the median of the last
``small_group_samples`` fresh samples (why each: ``docs/runbooks/straggler.md``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from app.policy.detectors.base import Detector, ParticipantKey, ParticipantSeries, subject_of
from app.policy.detectors.hang import TrainHangDetector
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, cap_points
from app.policy.world import World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m


@dataclass(slots=True)
class _Group:
    """The figures of one (job, role) on this tick, in parallel lists.

    Parallel lists of references to values the store already holds, not an object per
    participant: thousands of objects alive through the tick would be promoted by the garbage
    collector and bring on full collections over the whole series store."""

    keys: list[SeriesKey | None] = field(default_factory=list)  # None: a trainer's pace
    values: list[float] = field(default_factory=list)
    # whose figures are their own step time (a trainer's pace is not added beside it)
    owners: set[ParticipantKey] = field(default_factory=set)
    paced: dict[int, ParticipantKey] = field(default_factory=dict)  # index → whose pace
    rings: list[Any] = field(default_factory=list)  # each series figure's samples (None: pace)


class StragglerDetector(Detector):
    """See the module docstring. ``hang``: the train-hang detector whose paces (each trainer's
    step times, counted in its hang phases only) give a trainer without a step time of its
    own its figure; it runs before this one in the tick. Without one, this detector keeps and
    runs its own."""

    # Read in place every tick (World.rings), only the series of the roles judged, never
    # snapshotted as lists of points.
    lookups = (m.ROLLOUT_TOKENS_PER_SECOND, m.TRAIN_STEP_SECONDS)

    def __init__(self, policy: Policy, *, hang: TrainHangDetector | None = None) -> None:
        super().__init__(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._step_seconds = ParticipantSeries(m.TRAIN_STEP_SECONDS)
        self._own_hang = hang is None
        self._hang = hang if hang is not None else TrainHangDetector(policy)
        # trainer → [its step, its pace figure at that step, its (job, role)]: a median is
        # taken once a step, not once a tick
        self._figures: dict[ParticipantKey, list[Any]] = {}
        # small groups' members → their figure when last seen in line with their peers
        self._in_line: dict[object, tuple[float, float]] = {}
        self._in_line_now: dict[object, tuple[float, float]] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        det = self.policy.detection
        if self._own_hang:
            self._hang.run(world)
        rollouts = self._series_figures(world, self._throughput, det.rollout.roles)
        trainers = self._series_figures(
            world, self._step_seconds, det.trainer.roles, keep_owners=True
        )
        self._add_paces(world, trainers)
        out: list[FaultSignal] = []
        self._in_line_now = {}
        for group in rollouts.values():
            out.extend(self._judge(world, group, slow_is_low=True))
        for group in trainers.values():
            out.extend(self._judge(world, group, slow_is_low=False))
        self._in_line = self._in_line_now
        return out

    def _series_figures(
        self,
        world: World,
        series: ParticipantSeries,
        roles: tuple[str, ...],
        *,
        keep_owners: bool = False,
    ) -> dict[tuple[str, str], _Group]:
        """Fresh, positive figures of one metric, grouped by (job, role); ``keep_owners``: note
        whose they are (a trainer's own step time wins over its pace)."""
        oldest = world.now - self.policy.detection.stale_sample_seconds
        groups: dict[tuple[str, str], _Group] = {}
        # This loop runs over every rollout each tick: no key hashed, nothing allocated per
        # series, the cheap tests first.
        for job_role, rings in series.rings(world, roles).items():
            group = groups[job_role] = _Group()
            keys, values, owners, buffers = group.keys, group.values, group.owners, group.rings
            for points, key, pkey in rings:
                if points:
                    ts, value = points[-1]
                    if value > 0 and ts >= oldest:  # else stalled or silent: no figure, no peer
                        keys.append(key)
                        values.append(value)
                        buffers.append(points)
                        if keep_owners:
                            owners.add(pkey)
        return groups

    def _add_paces(self, world: World, groups: dict[tuple[str, str], _Group]) -> None:
        """A trainer that reports no step time of its own gets its pace as its figure: the
        median of its last ``pace_steps`` step times (a long-tail step or a restart's gap does
        not move it), while its step keeps moving: a pace stopped for three of its steps (and
        at least the stale-sample time) is a hang or a pause, not slowness."""
        want = self.policy.detection.straggler.pace_steps
        stale = self.policy.detection.stale_sample_seconds
        paces, cache = self._hang.paces, self._figures
        if len(cache) > len(paces) + 64:  # trainers gone
            self._figures = cache = {k: v for k, v in cache.items() if k in paces}
        for pkey, pace in paces.items():
            times = pace.step_times
            if len(times) < want:
                continue
            entry = cache.get(pkey)
            if entry is None:
                entry = cache[pkey] = [-1, 0.0, (pkey[0], pkey[1])]
            if entry[0] != pace.step:
                entry[0], entry[1] = pace.step, _median(islice(times, len(times) - want, None))
            figure = entry[1]
            if pace.stalled > stale and pace.stalled > 3 * figure:
                continue
            group = groups.get(entry[2])
            if group is None:
                group = groups[entry[2]] = _Group()
            if pkey not in group.owners:
                group.paced[len(group.values)] = pkey
                group.keys.append(None)
                group.values.append(figure)
                group.rings.append(None)

    def _judge(self, world: World, group: _Group, *, slow_is_low: bool) -> list[FaultSignal]:
        cfg = self.policy.detection.straggler
        values = group.values
        peers = len(values) - 1
        if peers < cfg.min_peers:
            if peers < cfg.small_group_min_peers:
                return []
            return self._judge_small(world, group, slow_is_low=slow_is_low)
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
            since = self.sticky_since(key or group.paced[i], world.now, open_ended=True)
            if world.now - since >= cfg.sustain_seconds:
                who = key if key is not None else group.paced[i]
                out.append(self._signal(world, who, value, median, limit, peers, since))
        return out

    def _judge_small(self, world: World, group: _Group, *, slow_is_low: bool) -> list[FaultSignal]:
        """A group of fewer than ``min_peers`` peers (see the module docstring)."""
        cfg = self.policy.detection.straggler
        ratio = cfg.throughput_ratio if slow_is_low else cfg.step_time_ratio
        figures = [self._smoothed(world, group, i) for i in range(len(group.values))]
        out: list[FaultSignal] = []
        for i, value in enumerate(figures):
            who = group.keys[i] or group.paced[i]
            others = figures[:i] + figures[i + 1 :]
            low, high = min(others), max(others)
            # beyond the ratio of every peer: of the fastest for slow_is_low, else the slowest
            ref = low if slow_is_low else high
            limit = ratio * ref
            if not (value < limit if slow_is_low else value > limit):
                self._in_line_now[who] = (value, ref)  # in line: its figure and its peers'
                continue
            before = self._in_line.get(who)
            if before is None:
                continue  # never seen in line: its spread may be its normal
            self._in_line_now[who] = before
            own, peers_ref = before
            # How much it slowed against how much its peers sped up since it was in line: a
            # rank its peer merely overtook has not slowed at all.
            slowed = own / value if slow_is_low else value / own
            sped_up = ref / peers_ref if slow_is_low else peers_ref / ref
            if slowed <= 1.0 or slowed < sped_up or high > cfg.small_group_agreement * low:
                continue
            since = self.sticky_since(who, world.now, open_ended=True)
            if world.now - since >= cfg.sustain_seconds:
                median = _median(others)
                out.append(
                    self._signal(
                        world, who, value, median, limit, len(others), since, small_group=True
                    )
                )
        return out

    def _smoothed(self, world: World, group: _Group, i: int) -> float:
        """Figure ``i`` of ``group``: a series' median of its last fresh samples, a pace as is."""
        points = group.rings[i]
        if points is None:
            return group.values[i]
        oldest = world.now - self.policy.detection.stale_sample_seconds * 4
        want = self.policy.detection.straggler.small_group_samples
        recent = [v for ts, v in islice(reversed(points), want) if ts >= oldest and v > 0]
        return _median(recent) if recent else group.values[i]

    def _signal(
        self,
        world: World,
        who: SeriesKey | ParticipantKey,
        value: float,
        median: float,
        limit: float,
        peers: int,
        since: float,
        small_group: bool = False,
    ) -> FaultSignal:
        cfg = self.policy.detection.straggler
        held = f"for {world.now - since:.0f}s; {peers} peers"
        if small_group:
            held += (
                " (a small group: beyond every peer, who agree with each other, and "
                "in line with them before)"
            )
        values: tuple[tuple[float, float], ...] = ((world.now, value),)
        if isinstance(who, SeriesKey):
            sub = subject_of(who)
            metric: str | None = who.name
            values = cap_points([(p.ts, p.value) for p in world.store.since(who, since)])
        else:  # a trainer's pace: its subject from the participant table
            node = next((p.node for p in world.participants if p.key == who), None)
            sub = Subject(node=node, job=who[0], role=who[1], rank=who[2])
            metric = None
        if metric == m.ROLLOUT_TOKENS_PER_SECOND:
            detail = (
                f"{sub.role}-{sub.rank} generates {value:.0f} tokens/s vs its peers' median "
                f"{median:.0f} ({value / median:.2f}x; a straggler below "
                f"{cfg.throughput_ratio:g}x) {held}"
            )
        else:
            source = (
                "train_step_seconds"
                if metric is not None
                else f"its pace: the median of its last {cfg.pace_steps} steps"
            )
            detail = (
                f"{sub.role}-{sub.rank} takes {value:.1f}s a step ({source}) vs its peers' "
                f"median {median:.1f}s ({value / median:.2f}x; a straggler above "
                f"{cfg.step_time_ratio:g}x) {held}"
            )
        evidence = Evidence(
            metric=metric,
            values=values,
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
            **({"small_group": True} if small_group else {}),
        )


def _median(values: Iterable[float]) -> float:
    """``statistics.median`` of a few values, without its generality (this runs on every step
    advance of every trainer)."""
    ranked = sorted(values)
    mid = len(ranked) // 2
    return ranked[mid] if len(ranked) % 2 else (ranked[mid - 1] + ranked[mid]) / 2


def _median_without(values: list[float], i: int) -> float:
    """The median of ``values`` (sorted) without its ``i``-th element, in O(1)."""
    n = len(values) - 1

    def at(j: int) -> float:
        return values[j] if j < i else values[j + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2
