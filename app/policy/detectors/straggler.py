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
per-rank compute time tells the slow one), otherwise its pace: the seconds per step over its
last ``pace_steps`` steps, as the policy saw its step move (ranks that step independently).

Cost: one pass over the figures of the tick (O(participants)); per group one sort, and only the
slow end of it is compared with its peer median.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from app.ingest.series_store import SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import (
    Detector,
    ParticipantKey,
    ParticipantSeries,
    participant_subject,
    subject_of,
)
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, cap_points
from app.policy.world import World


@dataclass(slots=True)
class _Figure:
    """One participant's figure on this tick and where it came from."""

    value: float
    subject: Subject
    key: SeriesKey | None = None  # its series, or None for a trainer's pace


@dataclass(slots=True)
class _Pace:
    """A trainer's step advances as the policy saw them: (seen at, step), oldest first."""

    step: int
    advances: deque[tuple[float, int]] = field(default_factory=deque)


class StragglerDetector(Detector):
    """See the module docstring."""

    metrics = (m.ROLLOUT_TOKENS_PER_SECOND, m.TRAIN_STEP_SECONDS)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._step_seconds = ParticipantSeries(m.TRAIN_STEP_SECONDS)
        self._paces: dict[ParticipantKey, _Pace] = {}
        hb = policy.detection.heartbeat
        # A process (re)starting: its next step is a first step again, its pace starts over.
        self._restarting = frozenset(policy.detection.startup.phases + hb.exited_phases)

    def detect(self, world: World) -> list[FaultSignal]:
        det = self.policy.detection
        rollouts = self._series_figures(world, self._throughput, set(det.rollout.roles))
        trainers = self._series_figures(world, self._step_seconds, set(det.trainer.roles))
        self._add_paces(world, trainers, set(det.trainer.roles))
        out: list[FaultSignal] = []
        for group in rollouts.values():
            out.extend(self._judge(world, group, slow_is_low=True))
        for group in trainers.values():
            out.extend(self._judge(world, group, slow_is_low=False))
        return out

    def _series_figures(
        self, world: World, series: ParticipantSeries, roles: set[str]
    ) -> dict[tuple[str, str], dict[ParticipantKey, _Figure]]:
        """Fresh, positive figures of one metric, grouped by (job, role)."""
        owners = series.owners(world)
        stale = self.policy.detection.stale_sample_seconds
        groups: dict[tuple[str, str], dict[ParticipantKey, _Figure]] = defaultdict(dict)
        for key, point in world.series(series.name):
            pkey = owners.get(key)
            if pkey is None or pkey[1] not in roles:
                continue
            if point.value <= 0 or world.now - point.ts > stale:
                continue  # stalled or silent: other detectors' cases, and no peer
            groups[(pkey[0], pkey[1])][pkey] = _Figure(point.value, subject_of(key), key)
        return groups

    def _add_paces(
        self,
        world: World,
        groups: dict[tuple[str, str], dict[ParticipantKey, _Figure]],
        roles: set[str],
    ) -> None:
        """Track every trainer's step advances; a trainer without its own step time gets its
        pace as its figure once it has been watched for ``pace_steps`` whole steps."""
        want = self.policy.detection.straggler.pace_steps
        seen: dict[ParticipantKey, _Pace] = {}
        for p in world.participants:
            if p.role not in roles:
                continue
            pace = self._paces.get(p.key)
            if pace is None or p.step < pace.step or p.phase in self._restarting:
                pace = _Pace(step=p.step, advances=deque(maxlen=want + 1))
            elif p.step > pace.step:
                pace.step = p.step
                pace.advances.append((world.now, p.step))
            seen[p.key] = pace
            if len(pace.advances) <= want:
                continue
            group = groups[(p.job, p.role)]
            if p.key in group:
                continue  # it reports its own step time
            (t0, s0), (t1, s1) = pace.advances[0], pace.advances[-1]
            group[p.key] = _Figure((t1 - t0) / (s1 - s0), participant_subject(p))
        self._paces = seen

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
        sub = fig.subject
        cfg = self.policy.detection.straggler
        held = f"for {world.now - since:.0f}s; {peers} peers"
        metric: str | None
        if fig.key is not None and fig.key.name == m.ROLLOUT_TOKENS_PER_SECOND:
            metric = m.ROLLOUT_TOKENS_PER_SECOND
            detail = (
                f"{sub.role}-{sub.rank} generates {fig.value:.0f} tokens/s vs its peers' median "
                f"{median:.0f} ({fig.value / median:.2f}x; a straggler below "
                f"{cfg.throughput_ratio:g}x) {held}"
            )
        else:
            metric = m.TRAIN_STEP_SECONDS if fig.key is not None else None
            source = "train_step_seconds" if fig.key is not None else "its pace"
            detail = (
                f"{sub.role}-{sub.rank} takes {fig.value:.1f}s a step ({source}) vs its peers' "
                f"median {median:.1f}s ({fig.value / median:.2f}x; a straggler above "
                f"{cfg.step_time_ratio:g}x) {held}"
            )
        values: tuple[tuple[float, float], ...] = ((world.now, fig.value),)
        if fig.key is not None:
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

