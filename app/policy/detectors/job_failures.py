"""Failures the job reports itself: failed train steps, rollout batch timeouts, stale actor
shards. (Failed state-log and checkpoint writes are the storage detector's.)"""

from __future__ import annotations

from collections import defaultdict

from app.policy.detectors.base import AT_LEAST_ONE, Detector, at_least_one, breach_run, subject_of
from app.policy.detectors.counters import CounterWatch, NodeMemory, counter_signal
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal
from app.policy.world import CHANGED, World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m

# (node, job, role, rank) of a series: what ties a failure counter to its step gauges.
_Ident = tuple[str, str | None, str | None, str | None]


class JobFailureDetector(Detector):
    """Failed train steps (OOM ...), rollout batch timeouts, stale actor shards."""

    metrics = (
        m.TRAIN_STEP_FAILURES_TOTAL,
        m.ROLLOUT_BATCH_TIMEOUTS_TOTAL,
        m.ACTOR_SHARD_STALE,
    )
    lookups = (m.TRAIN_LAST_FAILED_STEP, m.TRAIN_STEP)
    filters = {
        m.TRAIN_STEP_FAILURES_TOTAL: CHANGED,
        m.ROLLOUT_BATCH_TIMEOUTS_TOTAL: CHANGED,
        m.ACTOR_SHARD_STALE: AT_LEAST_ONE,
    }

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = CounterWatch()
        self._nodes = NodeMemory()
        # (job, step) → how many times that step failed: "the same step failing again".
        self.step_failures: dict[tuple[str, int], int] = defaultdict(int)
        self._failed_step: dict[SeriesKey, int | None] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        out = self._step_failures(world)
        out.extend(self._batch_timeouts(world))
        out.extend(self._stale_shards(world))
        self._nodes.commit(world)
        return out

    def _step_failures(self, world: World) -> list[FaultSignal]:
        hold = self.policy.detection.gpu.event_hold_seconds
        steps: dict[_Ident, float] | None = None

        def on_increase(key: SeriesKey, inc: float) -> None:
            nonlocal steps
            if steps is None:  # read only when a step failed: most ticks never need it
                steps = self._steps(world)
            value = steps.get(self._ident(key))
            step = int(value) if value is not None else None
            self._failed_step[key] = step
            job = key.label(m.LABEL_JOB)
            if step is not None and job is not None:
                self.step_failures[(job, step)] += int(max(1, inc))

        out: list[FaultSignal] = []
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
        return out

    def _steps(self, world: World) -> dict[_Ident, float]:
        """Each participant's step, its newest failed step where it reported one."""
        steps = {self._ident(k): pt.value for k, pt in world.all_series(m.TRAIN_STEP)}
        steps.update(
            {self._ident(k): pt.value for k, pt in world.all_series(m.TRAIN_LAST_FAILED_STEP)}
        )
        return steps

    def _batch_timeouts(self, world: World) -> list[FaultSignal]:
        name = m.ROLLOUT_BATCH_TIMEOUTS_TOTAL
        hold = self.policy.detection.gpu.event_hold_seconds
        return [
            counter_signal(self, world, FaultKind.ROLLOUT_BATCH_TIMEOUT, key, ep, hold)
            for key, ep in self._counters.episodes_of(world, name, self._nodes, hold)
        ]

    def _stale_shards(self, world: World) -> list[FaultSignal]:
        out: list[FaultSignal] = []
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
        return out

    @staticmethod
    def _ident(key: SeriesKey) -> _Ident:
        return (key.node, key.label(m.LABEL_JOB), key.label(m.LABEL_ROLE), key.label(m.LABEL_RANK))
