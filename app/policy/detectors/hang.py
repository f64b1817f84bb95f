"""Hang detection for real jobs: a trainer whose step stopped advancing (``train_hang``).

GPU utilisation does not tell (a hung all-reduce spins the GPUs at 100 %), so this detector
looks at the step alone: a trainer in one of ``hang_phases`` whose step did not advance for
``max(hang_min_seconds, hang_step_factor × its median step time)`` is hung. Only time in
``hang_phases`` counts, for the stall and for the step times (a weight sync, a save or an
evaluation pauses the clock). The pace is judged once the participant has shown
``hang_min_steps`` step times and advanced once since it (re)started. Before that, the
first-step budget holds: a participant whose start the detector saw (a start-up or exited
phase, its step going back, a new ``participant_pid``, or a job's step <=
``escalation.first_step_max``) and whose step has not moved is hung once it spent
``first_step_budget_seconds`` of its role (or the job's declared
``participant_first_step_budget_seconds``) in ``hang_phases`` after its start-up grace.
Time a trainer waits for rollout data while every rollout of its job is idle with nothing
pending (``StarvedRollouts``, the deadlock detector's predicate) counts for neither bound: that
is a cross-role deadlock, not the trainer's hang. Why each rule: ``docs/runbooks/train_hang.md``.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from app.policy.detectors.base import (
    Detector,
    ParticipantSeries,
    StartupGrace,
    participant_subject,
)
from app.policy.detectors.deadlock import StarvedRollouts
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal
from app.policy.world import ParticipantView, World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m

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
    # The first-step budget's clock: its start was seen (a start, a restart, a job's first
    # steps), and the seconds in hang phases after its start-up grace while it has not advanced.
    start_seen: bool = False
    first: float = 0.0
    pid: float | None = None  # the process behind the heartbeat, as last seen


class TrainHangDetector(Detector):
    """See the module docstring."""

    lookups = (
        m.PARTICIPANT_FIRST_STEP_BUDGET_SECONDS,
        m.PARTICIPANT_PID,
        m.ROLLOUT_TOKENS_PER_SECOND,
        m.ROLLOUT_PENDING_COUNT,
    )

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._paces: dict[tuple[str, str, int], Pace] = {}
        self._tick = 0
        self.startup = StartupGrace(policy)
        self._budgets = ParticipantSeries(m.PARTICIPANT_FIRST_STEP_BUDGET_SECONDS)
        self._pids = ParticipantSeries(m.PARTICIPANT_PID)
        self._starved_rollouts = StarvedRollouts(policy)
        # This tick's rollouts by job and answers of _starved (built only when asked).
        self._tick_rollouts: dict[str, list[ParticipantView]] | None = None
        self._tick_starved: dict[tuple[str, float], bool] = {}

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
        check, now = self.startup.check, world.now
        wait_phases = self.policy.detection.deadlock.wait_phases
        roles, hang_phases, node_last_seen = cfg.roles, cfg.hang_phases, world.node_last_seen
        grace, under_way, start_phases = (
            StartupGrace.GRACE,
            self.startup.under_way,
            self.startup.phases,
        )
        self._tick_rollouts, self._tick_starved = None, {}
        pids = self._pids.by_participant(world)  # one refresh a tick, not one per participant
        kept = 0  # paces seen this tick: fewer than there are, and some are gone
        for p in world.participants:
            if p.role not in roles:
                continue
            key = p.key
            node_seen = node_last_seen.get(p.node)
            node_fresh = node_seen is not None and now - node_seen < stale
            in_grace = (under_way or p.phase in start_phases) and check(p, now) is grace
            last = paces.get(key)
            # Waiting for data while every rollout of the job is starved: the clock stops.
            waits_on_starved = (
                last is not None
                and last.phase in wait_phases
                and p.phase in wait_phases
                and self._starved(world, p, last.seen_at)
            )
            series = pids.get(key)
            pace = self._observe(
                p,
                last,
                now,
                self._pid(world, series) if series else None,
                hang_phases,
                counting=node_fresh and not waits_on_starved,
                in_grace=in_grace,
            )
            if pace.tick != tick:
                kept += 1
                pace.tick = tick
            if last is None:
                paces[key] = pace
            if not node_fresh or p.phase not in hang_phases:
                continue  # a silent node is the silence detector's case
            if not pace.advanced:
                if pace.start_seen and pace.first > 0:
                    budget = self._first_step_budget(world, p)
                    if pace.first >= budget[0]:
                        out.append(self._first_step_signal(world, p, pace, budget))
                continue
            if len(pace.step_times) < cfg.hang_min_steps:
                continue
            median = statistics.median(pace.step_times)
            limit = max(cfg.hang_min_seconds, cfg.hang_step_factor * median)
            if pace.stalled >= limit:
                out.append(self._signal(world, p, pace, median, limit))
        if len(paces) > kept:
            for gone in [k for k, pace in paces.items() if pace.tick != tick]:
                del paces[gone]  # not a participant any more
        return out

    def _observe(
        self,
        p: ParticipantView,
        pace: Pace | None,
        now: float,
        pid: float | None,
        hang_phases: tuple[str, ...],
        *,
        counting: bool,
        in_grace: bool,
    ) -> Pace:
        if pace is None:
            first_steps = p.step <= self.policy.escalation.first_step_max
            return Pace(
                step=p.step,
                phase=p.phase,
                seen_at=now,
                pid=pid,
                start_seen=first_steps or p.phase in _STARTING_PHASES,
            )
        if counting and pace.phase in hang_phases:
            pace.stalled += now - pace.seen_at  # spent in the phase it was in at the last look
            if not pace.advanced and not in_grace:
                pace.first += now - pace.seen_at
        new_process = pid is not None and pace.pid is not None and pid != pace.pid
        if pid is not None:
            pace.pid = pid
        if p.phase in _STARTING_PHASES or p.step < pace.step or new_process:
            pace.advanced = False  # restarted: its next step is a first step
            pace.stalled = 0.0
            pace.start_seen, pace.first = True, 0.0
        elif p.step > pace.step:
            if pace.advanced:  # a whole step watched from its start: its time is the pace
                pace.step_times.append(pace.stalled / (p.step - pace.step))
            pace.advanced = True
            pace.stalled = 0.0
        pace.step, pace.phase, pace.seen_at = p.step, p.phase, now
        return pace

    def _pid(self, world: World, series: list[SeriesKey]) -> float | None:
        """The pid behind a participant's heartbeat (the newest of its ``participant_pid``
        ``series``), None when the agent sends none (an older agent: restarts are then seen by
        their phases only)."""
        best = None
        for key in series:
            point = world.store.latest(key)
            if point is not None and (best is None or point.ts > best.ts):
                best = point
        return best.value if best is not None else None

    def _starved(self, world: World, p: ParticipantView, since: float) -> bool:
        """Every rollout of ``p``'s job idle with nothing pending since ``since``: asked once
        per job and tick, the rollouts grouped by job once per tick and only when asked."""
        key = (p.job, since)
        hit = self._tick_starved.get(key)
        if hit is None:
            if self._tick_rollouts is None:
                roles = self.policy.detection.rollout.roles
                self._tick_rollouts = {}
                for r in world.participants:
                    if r.role in roles:
                        self._tick_rollouts.setdefault(r.job, []).append(r)
            rollouts = self._tick_rollouts.get(p.job, [])
            hit = self._starved_rollouts.all_idle(world, rollouts, since)
            self._tick_starved[key] = hit
        return hit

    def _first_step_budget(self, world: World, p: ParticipantView) -> tuple[float, str]:
        """The participant's first-step budget and where it comes from: what the job declared
        (its newest fresh ``participant_first_step_budget_seconds``), else the policy's."""
        best = None
        for key in self._budgets.of(world, p.key):
            point = world.store.latest(key)
            if point is not None and point.value > 0 and self.fresh(world, point):
                if best is None or point.ts > best.ts:
                    best = point
        if best is not None:
            return best.value, "declared by the job"
        return self.policy.detection.trainer.first_step_budget(p.role), "policy"

    def _first_step_signal(
        self, world: World, p: ParticipantView, pace: Pace, budget: tuple[float, str]
    ) -> FaultSignal:
        limit, source = budget
        phases = "/".join(self.policy.detection.trainer.hang_phases)
        evidence = Evidence(
            metric=None,
            values=((world.now - pace.first, float(p.step)), (world.now, float(p.step))),
            window_seconds=limit,
            threshold=limit,
            detail=f"{p.role}-{p.rank} has not finished its first step since it started: stuck "
            f"at step {p.step} for {pace.first:.0f}s in {phases} after its start-up grace "
            f"(first-step budget {limit:.0f}s, {source})",
        )
        return self.signal(
            world,
            FaultKind.TRAIN_HANG,
            participant_subject(p),
            evidence,
            since=world.now - pace.first,
            step=p.step,
            first_step=True,
            first_step_budget_seconds=limit,
        )

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
