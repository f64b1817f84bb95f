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

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field

from app.ingest.series_store import SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import Detector, ParticipantKey, ParticipantSeries, subject_of
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import CHANGED, World


@dataclass(slots=True)
class _Figure:
    """One participant's figure on this tick: its value and the series it came from."""

    value: float
    key: SeriesKey
    from_pace: bool = False  # a trainer's pace (from its train_step), not a reported figure


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
    metrics = (m.ROLLOUT_TOKENS_PER_SECOND, m.TRAIN_STEP_SECONDS, m.TRAIN_STEP)
    filters = {m.TRAIN_STEP: CHANGED}

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
    ) -> dict[tuple[str, str], dict[ParticipantKey, _Figure]]:
        """Fresh, positive figures of one metric, grouped by (job, role)."""
        owners = series.owners(world)
        oldest = world.now - self.policy.detection.stale_sample_seconds
        groups: dict[tuple[str, str], dict[ParticipantKey, _Figure]] = defaultdict(dict)
        # This loop runs over every rollout each tick: the cheap tests first.
        for key, (ts, value) in world.series(series.name):
            if value <= 0 or ts < oldest:
                continue  # stalled or silent: other detectors' cases, and no peer
            pkey = owners.get(key)
            if pkey is not None and pkey[1] in roles:
                groups[(pkey[0], pkey[1])][pkey] = _Figure(value, key)
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

    def _add_paces(
        self, world: World, groups: dict[tuple[str, str], dict[ParticipantKey, _Figure]]
    ) -> None:
        """A trainer that reports no step time of its own gets its pace as its figure: the
        median of its last ``pace_steps`` step times (a long-tail step or a restart's gap does
        not move it), while its step keeps moving at that pace."""
        stale = self.policy.detection.stale_sample_seconds
        for pkey, pace in list(self._paces.items()):
            quiet = world.now - pace.seen_at
            if quiet > _PACE_FORGET_SECONDS:
                del self._paces[pkey]
                continue
            if pace.figure is None or quiet > max(stale, 3 * pace.figure):
                continue  # not paced yet, or stopped (a hang or a pause: not slowness)
            group = groups[(pkey[0], pkey[1])]
            if pkey not in group:  # its own train_step_seconds wins
                group[pkey] = _Figure(pace.figure, pace.key, from_pace=True)

    def _judge(
        self, world: World, group: dict[ParticipantKey, _Figure], *, slow_is_low: bool
    ) -> list[FaultSignal]:
        cfg = self.policy.detection.straggler
        peers = len(group) - 1
        if peers < cfg.min_peers:
            return []
        ratio = cfg.throughput_ratio if slow_is_low else cfg.step_time_ratio
        # Slowest first: the loop stops at the first participant that is not a straggler (all
        # after it are faster, and their peer medians no lower).
        ranked = sorted(group.items(), key=lambda kv: kv[1].value, reverse=not slow_is_low)
        values = [f.value for _, f in ranked]
        out: list[FaultSignal] = []
        for i, (pkey, fig) in enumerate(ranked):
            median = _median_without(values, i)
            limit = ratio * median
            if (fig.value >= limit) if slow_is_low else (fig.value <= limit):
                break
            since = self.sticky_since(pkey, world.now, open_ended=True)
            if world.now - since >= cfg.sustain_seconds:
                out.append(self._signal(world, fig, median, limit, peers, since))
        return out

    def _signal(
        self, world: World, fig: _Figure, median: float, limit: float, peers: int, since: float
    ) -> FaultSignal:
        sub = subject_of(fig.key)
        cfg = self.policy.detection.straggler
        held = f"for {world.now - since:.0f}s; {peers} peers"
        metric: str | None
        if fig.key.name == m.ROLLOUT_TOKENS_PER_SECOND:
            metric = m.ROLLOUT_TOKENS_PER_SECOND
            detail = (
                f"{sub.role}-{sub.rank} generates {fig.value:.0f} tokens/s vs its peers' median "
                f"{median:.0f} ({fig.value / median:.2f}x; a straggler below "
                f"{cfg.throughput_ratio:g}x) {held}"
            )
        else:
            metric = m.TRAIN_STEP if fig.from_pace else m.TRAIN_STEP_SECONDS
            source = (
                f"its pace: the median of its last {cfg.pace_steps} steps"
                if fig.from_pace
                else "train_step_seconds"
            )
            detail = (
                f"{sub.role}-{sub.rank} takes {fig.value:.1f}s a step ({source}) vs its peers' "
                f"median {median:.1f}s ({fig.value / median:.2f}x; a straggler above "
                f"{cfg.step_time_ratio:g}x) {held}"
            )
        values = cap_points([(p.ts, p.value) for p in world.store.since(fig.key, since)])
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
            figure=round(fig.value, 3),
            peer_median=round(median, 3),
            peers=peers,
        )


def _median_without(values: list[float], i: int) -> float:
    """The median of ``values`` (sorted, either way) without its ``i``-th element, in O(1)."""
    n = len(values) - 1

    def at(j: int) -> float:
        return values[j] if j < i else values[j + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2

