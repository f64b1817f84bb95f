"""A rollout's inference engine (vLLM, SGLang) that stopped answering: ``rollout_engine_down``.

The node agent probes each engine's ``/health`` every round (``--engine``) and sends
``rollout_engine_up`` 1/0 with the participant's labels (job, role, rank) and ``engine``. An
engine whose probe fails for ``detection.engine.down_seconds`` while its node keeps reporting is
dead or wedged (a hung scheduler answers nothing, though its process lives and its GPU memory
stays allocated): the plan restarts that role through the launcher (``restart_role``).

An engine that answers but generates nothing is not a fault: a rollout waiting on a tool call or
a sandbox keeps its engine idle and healthy. Only the probe decides. A probe failing for a
shorter time (a long weight load, a restart the launcher already did) clears by itself. The
engine of a participant in its start-up grace (:class:`StartupGrace`: loading and compiling
for minutes) is not judged.
"""

from __future__ import annotations

from app.policy import metric_names as m
from app.policy.detectors.base import Detector, StartupGrace, breach_run, subject_of
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import Threshold, World


class InferenceEngineDownDetector(Detector):
    """``rollout_engine_up`` at 0 for ``down_seconds`` on a node that still reports."""

    metrics = (m.ROLLOUT_ENGINE_UP,)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {m.ROLLOUT_ENGINE_UP: Threshold("le", 0.0)}  # only failing probes come
        self.startup = StartupGrace(policy)

    def detect(self, world: World) -> list[FaultSignal]:
        down_for = self.policy.detection.engine.down_seconds
        stale = self.policy.detection.stale_sample_seconds
        starting = {
            p.key for p in world.participants if self.startup.check(p, world.now) is not None
        }
        out: list[FaultSignal] = []
        for key, latest in world.series(m.ROLLOUT_ENGINE_UP):
            if latest.value > 0 or not self.fresh(world, latest):
                continue  # answering, or the node went quiet (the node detector's case)
            points = world.store.since(key, world.now - down_for - stale)
            run = breach_run(points, lambda v: v <= 0)
            if not run:
                continue
            start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
            if world.now - start < down_for:
                continue
            engine = key.label(m.LABEL_ENGINE) or "engine"
            subject = subject_of(key)
            if (subject.job, subject.role, subject.rank) in starting:
                continue  # loading, compiling: its start-up grace
            evidence = Evidence(
                metric=m.ROLLOUT_ENGINE_UP,
                values=cap_points([(p.ts, p.value) for p in run]),
                window_seconds=down_for,
                threshold=0.0,
                detail=f"{engine} of {subject.role}-{subject.rank} has not answered its health "
                f"probe for {world.now - start:.0f}s (down after {down_for:.0f}s) while its "
                f"node still reports",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ROLLOUT_ENGINE_DOWN,
                    subject,
                    evidence,
                    since=start,
                    engine=engine,
                )
            )
        return out
