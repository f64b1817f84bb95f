"""Hang detection for real jobs: a trainer whose step stopped advancing.

A hung collective (NCCL waiting for a peer that will never come), a deadlocked data loader or a
SIGSTOPped process all look the same from outside: the trainer's step does not move. GPU
utilisation does not tell (a hung all-reduce spins the GPUs at 100 %), so this detector looks at
the step alone: a trainer in one of ``hang_phases`` whose step did not advance for

    max(hang_min_seconds, hang_step_factor × its median step time)

is hung (``train_hang``). Only time spent in ``hang_phases`` counts, both for the stall and for
the step times: a long weight sync, a checkpoint save or a slow evaluation pauses the clock
instead of looking like a hang. Nothing is judged until the participant has shown its pace
(``hang_min_steps`` step times) and advanced once since it (re)started: the first steps of a
process include compilation, warm-up and loading, and say nothing about how long a step takes.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.policy.detectors.base import Detector, participant_subject
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal
from app.policy.world import ParticipantView, World

# Step times kept per participant for its median (recent pace matters, not the whole run's).
_STEP_TIMES_KEPT = 64
# Phases of a process that is (re)starting: its next step is a first step again.
_STARTING_PHASES = frozenset({"INIT", "STARTING", "EXITED"})


@dataclass
class Pace:
    """What the detector remembers of one participant between ticks."""

    step: int
    phase: str
    seen_at: float
    stalled: float = 0.0  # seconds in hang phases since the step last advanced
    advanced: bool = False  # advanced at least once since first seen or (re)started
    step_times: deque[float] = field(default_factory=lambda: deque(maxlen=_STEP_TIMES_KEPT))
    tick: int = 0  # the detector's tick that last saw it


class TrainHangDetector(Detector):
    """See the module docstring."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._paces: dict[tuple[str, str, int], Pace] = {}
        self._tick = 0

    @property
    def paces(self) -> Mapping[tuple[str, str, int], Pace]:
        """Every trainer's pace as of the last tick (the straggler detector compares them)."""
        return self._paces

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.trainer
        stale = self.policy.detection.stale_sample_seconds
        # Updated in place: an entry that exists keeps its key object, so the key tuple each
        # participant builds per tick dies at once instead of surviving into the GC's oldest
        # generation (thousands a tick at fleet scale, a full collection every few ticks).
        paces = self._paces
        self._tick = tick = self._tick + 1
        out: list[FaultSignal] = []
        for p in world.participants:
            if p.role not in cfg.roles:
                continue
            node_seen = world.node_last_seen.get(p.node)
            node_fresh = node_seen is not None and world.now - node_seen < stale
            pace = self._observe(p, world.now, counting=node_fresh)
            pace.tick = tick
            paces[p.key] = pace
            if not node_fresh or p.phase not in cfg.hang_phases or not pace.advanced:
                continue  # a silent node is the silence detector's case
            if len(pace.step_times) < cfg.hang_min_steps:
                continue
            median = statistics.median(pace.step_times)
            limit = max(cfg.hang_min_seconds, cfg.hang_step_factor * median)
            if pace.stalled >= limit:
                out.append(self._signal(world, p, pace, median, limit))
        for key in [k for k, pace in paces.items() if pace.tick != tick]:
            del paces[key]  # not a participant any more
        return out

    def _observe(self, p: ParticipantView, now: float, *, counting: bool) -> Pace:
        hang_phases = self.policy.detection.trainer.hang_phases
        pace = self._paces.get(p.key)
        if pace is None:
            return Pace(step=p.step, phase=p.phase, seen_at=now)
        if counting and pace.phase in hang_phases:
            pace.stalled += now - pace.seen_at  # spent in the phase it was in at the last look
        if p.phase in _STARTING_PHASES or p.step < pace.step:
            pace.advanced = False  # restarted: its next step is a first step
            pace.stalled = 0.0
        elif p.step > pace.step:
            if pace.advanced:  # a whole step watched from its start: its time is the pace
                pace.step_times.append(pace.stalled / (p.step - pace.step))
            pace.advanced = True
            pace.stalled = 0.0
        pace.step, pace.phase, pace.seen_at = p.step, p.phase, now
        return pace

    def _signal(
        self, world: World, p: ParticipantView, pace: Pace, median: float, limit: float
    ) -> FaultSignal:
        cfg = self.policy.detection.trainer
        evidence = Evidence(
            metric=None,
            values=((world.now - pace.stalled, float(p.step)), (world.now, float(p.step))),
            window_seconds=limit,
            threshold=limit,
            detail=f"{p.role}-{p.rank} stuck at step {p.step} for {pace.stalled:.0f}s in "
            f"{'/'.join(cfg.hang_phases)} (median step {median:.1f}s; limit "
            f"max({cfg.hang_min_seconds:g}s, {cfg.hang_step_factor:g} x median) = {limit:.0f}s)",
        )
        return self.signal(
            world,
            FaultKind.TRAIN_HANG,
            participant_subject(p),
            evidence,
            since=world.now - pace.stalled,
            step=p.step,
            median_step_seconds=round(median, 3),
        )
