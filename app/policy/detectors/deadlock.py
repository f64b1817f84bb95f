"""Cross-role deadlock: the trainer waits for rollout data that no rollout is producing.

What verl #7155 (the trainer blocked forever in ``ReplayBuffer.sample()`` while the rollouts
sit idle), verl-omni #433 (a dead engine reported as success, the trainer waits forever),
verl #6387 (a failed sample taken for end-of-data) and ms-swift #8053 (trainer at 100 % GPU,
rollout at 0 %) have in common, seen from outside: every trainer of a job waits for data (its
phase one of ``wait_phases``, its step frozen) while every rollout of the job is idle with
nothing pending (no tokens generated, no rollout queued), every heartbeat fresh. No
participant is dead, hung or slow by itself, so no per-participant detector fires; the fault is
between the roles.

Held ``sustain_seconds``, it is one incident about the job (``cross_role_deadlock``, subject
the job's rollout role) whose evidence names both sides; its plan restarts the rollouts first
(their restart re-announces work; the trainer, restarted, would only wait again for the same
data). Each side alone is normal: a trainer waiting while rollouts generate, rollouts idle
while the trainer trains, a rollout waiting on a tool while others generate, a rollout with
work queued (an engine dead inside a live worker is ``rollout_engine_down``'s).
"""

from __future__ import annotations

from app.policy.detectors.base import Detector, ParticipantSeries
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import ParticipantView, World
from recovery.protocol import metric_names as m


class StarvedRollouts:
    """The rollout side of the deadlock: every rollout of a job alive, generating nothing and
    with nothing pending. One predicate, asked by this detector over its window and by
    ``train_hang`` (which defers to a deadlock that is building up, so that the plan restarts
    the rollouts and not the trainer that waits for them)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._tokens = ParticipantSeries(m.ROLLOUT_TOKENS_PER_SECOND)
        self._pending = ParticipantSeries(m.ROLLOUT_PENDING_COUNT)

    def all_idle(self, world: World, rollouts: list[ParticipantView], since: float) -> bool:
        """There is at least one rollout and every one is idle since ``since``."""
        return bool(rollouts) and all(self.idle(world, r, since) for r in rollouts)

    def idle(self, world: World, p: ParticipantView, since: float) -> bool:
        """Alive, generating nothing since ``since`` (its newest rate included, however old)
        and with nothing pending now."""
        det = self.policy.detection
        if world.heartbeat_silence(p) >= det.heartbeat.suspect_seconds:
            return False  # silent: the liveness detectors' case
        if p.phase in det.heartbeat.finished_phases or p.phase in det.heartbeat.exited_phases:
            return False
        for key in self._tokens.of(world, p.key):
            points = world.store.since(key, since)
            if any(pt.value > 0 for pt in points):
                return False
            newest = None if points else world.store.latest(key)
            if newest is not None and newest.value > 0:
                return False  # its last rate, older than the window, is not idleness
        for key in self._pending.of(world, p.key):
            latest = world.store.latest(key)
            if latest is not None and latest.value > 0:
                return False  # work queued: an engine dead in a live worker, not a deadlock
        return True


class CrossRoleDeadlockDetector(Detector):
    """See the module docstring."""

    lookups = (m.ROLLOUT_TOKENS_PER_SECOND, m.ROLLOUT_PENDING_COUNT)

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._starved = StarvedRollouts(policy)
        # trainer -> (its step, since when that step has not moved)
        self._steps: dict[tuple[str, str, int], tuple[int, float]] = {}

    def detect(self, world: World) -> list[FaultSignal]:
        det = self.policy.detection
        cfg = det.deadlock
        trainer_roles, rollout_roles = det.trainer.roles, det.rollout.roles
        wait_phases = cfg.wait_phases
        # The common case first, in one cheap pass: no trainer waits for data anywhere.
        waiting: dict[str, list[ParticipantView]] = {}
        for p in world.participants:
            if p.phase in wait_phases and p.role in trainer_roles:
                waiting.setdefault(p.job, []).append(p)
        if not waiting:
            # The clocks stay (checked against the step when used): a job whose trainers all
            # pass through another phase for a tick keeps its count. Bounded by the fleet.
            if len(self._steps) > 2 * len(world.participants) + 64:
                self._steps = {}
            return []
        now, silence, suspect = world.now, world.heartbeat_silence, det.heartbeat.suspect_seconds
        steps = self._steps
        seen = dict(steps) if len(steps) <= 2 * len(world.participants) + 64 else {}
        spoiled: set[str] = set()  # jobs with a trainer that is not waiting
        rollouts: dict[str, list[ParticipantView]] = {}
        for p in world.participants:
            if p.job not in waiting:
                continue
            if p.role in trainer_roles:
                # Since when its step has not moved, whatever phase it passes through meanwhile
                # (a COLLECT timeout's retry goes through other phases without a new step).
                prev = steps.get(p.key)
                seen[p.key] = prev if prev is not None and prev[0] == p.step else (p.step, now)
                if p.phase not in wait_phases or silence(p) >= suspect:
                    spoiled.add(p.job)
            elif p.role in rollout_roles:
                rollouts.setdefault(p.job, []).append(p)
        self._steps = seen
        out: list[FaultSignal] = []
        for job, trainers in waiting.items():
            if job in spoiled or not rollouts.get(job):
                continue
            frozen_since = max(seen[t.key][1] for t in trainers)
            if now - frozen_since < cfg.sustain_seconds:
                continue  # a step moved (or the wait began) within the window
            if not self._starved.all_idle(world, rollouts[job], now - cfg.sustain_seconds):
                continue
            since = self.sticky_since(
                job, max(frozen_since, now - cfg.sustain_seconds), open_ended=True
            )
            out.append(self._signal(world, job, trainers, rollouts[job], since))
        return out

    def _signal(
        self,
        world: World,
        job: str,
        trainers: list[ParticipantView],
        rollouts: list[ParticipantView],
        since: float,
    ) -> FaultSignal:
        cfg = self.policy.detection.deadlock
        waiting = ", ".join(f"{t.role}-{t.rank} ({t.phase}, step {t.step})" for t in trainers)
        idle = ", ".join(f"{r.role}-{r.rank}" for r in rollouts)
        role = rollouts[0].role
        evidence = Evidence(
            metric=None,
            values=((since, 0.0), (world.now, 0.0)),
            window_seconds=cfg.sustain_seconds,
            threshold=cfg.sustain_seconds,
            detail=f"job {job}: {waiting} waiting for rollout data, step frozen for "
            f"{world.now - since:.0f}s, while every rollout ({idle}) is idle with nothing "
            f"pending: a cross-role deadlock (restart the rollouts first)",
        )
        return self.signal(
            world,
            FaultKind.CROSS_ROLE_DEADLOCK,
            Subject(job=job, role=role),
            evidence,
            since=since,
            step=max(t.step for t in trainers),
            trainers=[f"{t.role}-{t.rank}" for t in trainers],
            rollouts=[f"{r.role}-{r.rank}" for r in rollouts],
        )
