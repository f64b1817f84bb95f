"""A rollout's inference engine (vLLM, SGLang) that stopped answering: ``rollout_engine_down``.

The node agent probes each engine's ``/health`` every round (``--engine``) and sends
``rollout_engine_up`` 1/0 with the participant's labels (job, role, rank) and ``engine``. An
engine whose probe fails for ``detection.engine.down_seconds`` while its node keeps reporting is
dead or wedged (a hung scheduler answers nothing, though its process lives and its GPU memory
stays allocated): the plan restarts that role through the launcher (``restart_role``).

An engine that answers but generates nothing, with nothing piling up, is not a fault: a rollout
waiting on a tool call or a sandbox keeps its engine idle and healthy. A probe failing for a
shorter time (a long weight load, a restart the launcher already did) clears by itself. The
engine of a participant in its start-up grace (:class:`StartupGrace`: loading and compiling
for minutes) is not judged.

An engine can also die inside a worker that lives on (verl-omni #433, OpenRLHF #331: the engine
process crashed or wedged, the rollout worker around it keeps its heartbeat and keeps accepting
work). ``EngineStalledDetector`` sees it without a probe, from progress: a rollout whose heartbeat
is alive but that generated no tokens for ``detection.rollout.stall_timeout_seconds`` while its
work piles up (its pending rollouts rose since the stall began, or its step stayed frozen the
whole time with rollouts pending). A rollout waiting on a tool generates nothing too, but
nothing piles up at its engine (pending flat at zero, or its step moving): it stays quiet.
"""

from __future__ import annotations

from app.ingest.series_store import SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import (
    Detector,
    ParticipantKey,
    ParticipantSeries,
    StartupGrace,
    breach_run,
    participant_subject,
    subject_of,
)
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import ParticipantView, Threshold, World


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


class EngineStalledDetector(Detector):
    """An engine dead inside a live worker, seen from progress (see the module docstring).

    The same kind as the probe's, ``rollout_engine_down``, on purpose: the fault is the same
    (the engine is dead, the worker around it lives), so is the repair (``restart_role``
    restarts that rollout, its engine with it: the plan the probe's case already has), and a
    participant seen both ways is one incident, not two. ``rollout_down`` would say the wrong
    thing: a worker gone, heartbeat and all (its plan also moves the batches of a node that
    may not come back). The evidence says which way it was seen (``reason``: ``no_progress``).
    """

    metrics = (m.ROLLOUT_ENGINE_UP,)
    # Throughput: read in place, the rollouts' only (ParticipantSeries.rings).
    lookups = (m.ROLLOUT_TOKENS_PER_SECOND, m.ROLLOUT_PENDING_COUNT)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.filters = {m.ROLLOUT_ENGINE_UP: Threshold("le", 0.0)}  # only failing probes come
        self.startup = StartupGrace(policy)
        self._throughput = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._pending = ParticipantSeries(m.ROLLOUT_PENDING_COUNT)
        # stalled participant → (its step, since when we have seen that step)
        self._steps: dict[ParticipantKey, tuple[int, float]] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection
        oldest = world.now - cfg.stale_sample_seconds
        zero: dict[ParticipantKey, SeriesKey] = {}
        for rings in self._throughput.rings(world, cfg.rollout.roles).values():
            for points, key, pkey in rings:
                if points:
                    ts, value = points[-1]
                    if value <= 0 and ts >= oldest:
                        zero[pkey] = key
        probe_down = set()
        for key, point in world.series(m.ROLLOUT_ENGINE_UP):
            if point.value <= 0:
                sub = subject_of(key)
                probe_down.add((sub.job, sub.role, sub.rank))
        roles, now, check = cfg.rollout.roles, world.now, self.startup.check
        steps: dict[ParticipantKey, tuple[int, float]] = {}
        out: list[FaultSignal] = []
        for p in world.participants:
            # Every rollout goes through the start-up check on every tick (it must see a start
            # when it begins); the rest only for the few generating nothing.
            if p.role not in roles or check(p, now) is not None or not zero:
                continue
            pkey = (p.job, p.role, p.rank)
            stalled = zero.get(pkey)
            if stalled is None:
                continue  # generating
            prev = self._steps.get(pkey)
            steps[pkey] = prev if prev is not None and prev[0] == p.step else (p.step, now)
            if (
                p.phase in cfg.heartbeat.finished_phases
                or now - p.last_heartbeat_ts >= cfg.heartbeat.suspect_seconds
                or pkey in probe_down
            ):
                continue  # gone on purpose; heartbeat late (the stall detector's); the probe's
            sig = self._judge(world, p, stalled, steps[pkey][1])
            if sig is not None:
                out.append(sig)
        self._steps = steps
        return out

    def _judge(
        self, world: World, p: ParticipantView, key: SeriesKey, step_since: float
    ) -> FaultSignal | None:
        timeout = self.policy.detection.rollout.stall_timeout_seconds
        if any(
            (pt := world.store.latest(k)) is not None and pt.value > 0
            for k in self._throughput.of(world, p.key)
        ):
            return None  # another of its series (its engine's) still generates
        points = world.store.since(key, world.now - 2 * timeout)
        run = breach_run(points, lambda v: v <= 0)
        if not run:
            return None
        start = self.sticky_since(key, run[0].ts, open_ended=len(run) == len(points))
        if world.now - start < timeout:
            return None
        pending = [
            pts for k in self._pending.of(world, p.key) if (pts := world.store.since(k, start))
        ]
        if not pending:
            return None  # nothing says that work waits for it
        pts = max(pending, key=lambda s: s[-1].value)
        if not self.fresh(world, pts[-1]):
            return None
        first, last = pts[0].value, pts[-1].value
        if last > first:
            why = f"its pending rollouts rose from {first:g} to {last:g}"
        elif world.now - step_since >= timeout and min(pt.value for pt in pts) > 0:
            why = (
                f"its step stayed at {p.step} for {world.now - step_since:.0f}s with {last:g} "
                f"rollouts pending"
            )
        else:
            return None  # nothing piles up: waiting on a tool
        hb_age = world.now - p.last_heartbeat_ts
        evidence = Evidence(
            metric=m.ROLLOUT_PENDING_COUNT,
            values=cap_points([(pt.ts, pt.value) for pt in pts]),
            window_seconds=timeout,
            threshold=first,
            detail=f"the engine of {p.role}-{p.rank} generated no tokens for "
            f"{world.now - start:.0f}s while its worker's heartbeat is alive ({hb_age:.0f}s "
            f"ago) and {why}: an engine dead inside a live worker",
        )
        return self.signal(
            world,
            FaultKind.ROLLOUT_ENGINE_DOWN,
            participant_subject(p),
            evidence,
            since=start,
            step=p.step,
            engine=key.label(m.LABEL_ENGINE) or "engine",
            reason="no_progress",
        )
