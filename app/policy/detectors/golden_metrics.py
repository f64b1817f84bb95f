"""Golden metrics: a metric above its warning threshold for its breach duration.

Two rules keep a metric that hovers around its threshold from opening and resolving incidents
over and over (``golden_metrics`` in policy.yaml):

- Hysteresis: a breach starts at a sample above ``warning`` and lasts until a *healthy* sample
  (at or under ``healthy``); samples between the two do not end it. A ratio swinging between
  0.24 and 0.36 around a 0.3 warning is one breach, not a series of short ones that never last.
- Minimum hold: once a metric's signal has fired, a new breach within the incidents' quiet
  period continues it at once (same ``since``) instead of waiting ``breach_seconds`` again, so
  the incident stays open across short healthy spells rather than resolving and reopening.
"""

from __future__ import annotations

from app.policy.detectors.base import Detector, breach_run, subject_of
from app.policy.policy_file import GoldenMetricRule, Policy
from app.policy.signals import Evidence, FaultSignal, cap_points
from app.policy.world import BreachRun, World
from app.series.store import SeriesKey


class GoldenMetricDetector(Detector):
    """A golden metric above its warning threshold for its breach duration."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        # Ingest keeps, per series, the newest breaching sample of its current unhealthy run
        # (a standing question to the store, ``BreachRun``); only those series are judged. A
        # re-read of the look-back window of every series between healthy and warning each
        # tick was most of the tick at cluster scale, almost always to find no breach.
        rules = policy.golden_metrics
        self.metrics = tuple(rules)
        self.filters = {
            name: BreachRun(rule.healthy, rule.warning, rule.inclusive)
            for name, rule in rules.items()
        }
        # key → (since, last fired): the minimum hold's memory, kept across ticks.
        self._fired: dict[SeriesKey, tuple[float, float]] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        hold = self.policy.incidents.quiet_period_seconds
        stale = self.policy.detection.stale_sample_seconds
        self._fired = {k: v for k, v in self._fired.items() if world.now - v[1] <= hold}
        out: list[FaultSignal] = []
        for name, rule in self.policy.golden_metrics.items():
            # _judge's look-back start, computed as it does (the same float, to the last bit):
            # an older breach is outside the window, so _judge would find no run that breaches
            oldest = world.now - (rule.breach_seconds + stale)
            for key, breach, newest in world.breach_runs(name):
                if breach < oldest or not self.fresh(world, newest):
                    continue
                sig = self._judge(world, key, rule)
                if sig is not None:
                    out.append(sig)
        return out

    def _judge(self, world: World, key: SeriesKey, rule: GoldenMetricRule) -> FaultSignal | None:
        lookback = rule.breach_seconds + self.policy.detection.stale_sample_seconds
        points = world.store.since(key, world.now - lookback)
        unhealthy = breach_run(points, rule.unhealthy)
        run = unhealthy[
            next((i for i, p in enumerate(unhealthy) if rule.breaches(p.value)), len(unhealthy)) :
        ]
        if not run:
            return None
        held = self._fired.get(key)
        if held is not None:  # the minimum hold: the same occurrence goes on
            start = held[0]
        else:
            start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
            covered = len(run) < len(points) or start <= world.now - rule.breach_seconds
            if not covered or world.now - start < rule.breach_seconds:
                return None
        self._fired[key] = (start, world.now)
        evidence = Evidence(
            metric=key.name,
            values=cap_points([(p.ts, p.value) for p in run]),
            window_seconds=rule.breach_seconds,
            threshold=rule.warning,
            detail=f"{key.name} {'>=' if rule.inclusive else '>'} {rule.warning} "
            f"for {world.now - start:.0f}s (healthy {rule.healthy})",
        )
        return self.signal(world, rule.kind, subject_of(key), evidence, since=start)
