"""Golden metrics: a metric above its warning threshold for its breach duration."""

from __future__ import annotations

from app.ingest.series_store import SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import Detector, breach_run, subject_of
from app.policy.policy_file import GoldenMetricRule, Policy
from app.policy.signals import Evidence, FaultSignal, cap_points
from app.policy.world import Threshold, World


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
