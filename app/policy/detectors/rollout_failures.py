"""Rollouts that fail while the job goes on: a rising share of failed or empty generations.

verl #6387 (a failed fully-async sample treated as end-of-data) and verl-omni #433 (a dead
engine reported as success) are failures a framework turns into data, or into silence. Before
the data runs dry, the job's own counters show it: its rollouts report the generations they
finished (``rollout_samples_total``, failed ones included) and those that failed or came back
empty (``rollout_failed_samples_total``, the heartbeat API's ``record_failed_samples``). Over
``window_seconds``, summed over the job's rollouts, at least ``min_samples`` finished and at
least ``failure_ratio`` of them failed: ``rollout_samples_failing``, one incident about the
job's rollouts. Counters that went back (a restart without carry-over) count from their new
value. Rollouts that report failures but no total give no ratio, and no incident: any
number of failures is a small share of a large enough total (the series is still shown).
"""

from __future__ import annotations

from app.policy.detectors.base import Detector
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m


class RolloutSampleFailureDetector(Detector):
    """See the module docstring."""

    lookups = (m.ROLLOUT_FAILED_SAMPLES_TOTAL, m.ROLLOUT_SAMPLES_TOTAL)

    def detect(self, world: World) -> list[FaultSignal]:
        failed_series = world.all_series(m.ROLLOUT_FAILED_SAMPLES_TOTAL)
        if not failed_series:
            return []  # no job reports failed samples: nothing to judge
        cfg = self.policy.detection.sample_failures
        start = world.now - cfg.window_seconds
        failed: dict[tuple[str, str], float] = {}
        for key, _ in failed_series:
            job_role = (key.label(m.LABEL_JOB) or "", key.label(m.LABEL_ROLE) or "")
            failed[job_role] = failed.get(job_role, 0.0) + self._rise(world, key, start)
        totals: dict[tuple[str, str], float] = {}
        for key, _ in world.all_series(m.ROLLOUT_SAMPLES_TOTAL):
            job_role = (key.label(m.LABEL_JOB) or "", key.label(m.LABEL_ROLE) or "")
            if job_role in failed:
                totals[job_role] = totals.get(job_role, 0.0) + self._rise(world, key, start)
        out: list[FaultSignal] = []
        for (job, role), bad in failed.items():
            if (job, role) not in totals:
                continue  # no denominator: no ratio
            total = max(totals[(job, role)], bad)
            if not job or total < cfg.min_samples or bad < cfg.failure_ratio * total:
                continue
            since = self.sticky_since((job, role), world.now, open_ended=True)
            evidence = Evidence(
                metric=m.ROLLOUT_FAILED_SAMPLES_TOTAL,
                values=((start, 0.0), (world.now, bad)),
                window_seconds=cfg.window_seconds,
                threshold=cfg.failure_ratio,
                detail=f"job {job}: {bad:.0f} of {total:.0f} generations of its {role}s failed "
                f"or came back empty in the last {cfg.window_seconds:.0f}s "
                f"({bad / total:.0%}; an incident from {cfg.failure_ratio:.0%} of at least "
                f"{cfg.min_samples})",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ROLLOUT_SAMPLES_FAILING,
                    Subject(job=job, role=role),
                    evidence,
                    since=since,
                    failed=int(bad),
                    samples=int(total),
                )
            )
        return out

    @staticmethod
    def _rise(world: World, key: SeriesKey, start: float) -> float:
        """How much a counter rose since ``start`` (from its new value after a reset)."""
        points = world.store.since(key, start)
        if len(points) < 2:
            return 0.0
        rise, prev = 0.0, points[0].value
        for pt in points[1:]:
            rise += pt.value - prev if pt.value >= prev else pt.value
            prev = pt.value
        return rise
