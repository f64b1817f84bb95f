"""cross_role_deadlock: every trainer of a job waits for data, step frozen, while every rollout
idles with nothing pending, sustained: one job-level incident naming both sides, restarting
the rollouts; each side alone, a rollout with work queued, or a silent one is not."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.policy.classifier import Classifier, choose_actions
from app.policy.detectors.deadlock import CrossRoleDeadlockDetector
from app.policy.detectors.hang import TrainHangDetector
from app.policy.engine import PolicyEngine
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(60)
SUSTAIN = 90


def _job(
    trainer_phase: str,
    step: Callable[[Cluster], int],
    tokens: float,
    pending: float | None = None,
    rollout_phase: str = "ROLLOUT",
) -> Callable[[Cluster], None]:
    def f(c: Cluster) -> None:
        for rank in (0, 1):
            c.participant("trainer", rank, "n0", phase=trainer_phase, step=step(c))
            c.put("n0", "x", 1)
        for rank in (0, 1):
            node = f"n{rank + 1}"
            c.participant("rollout", rank, node, phase=rollout_phase, step=3)
            c.put(
                node, m.ROLLOUT_TOKENS_PER_SECOND, tokens, job=JOB, role="rollout", rank=str(rank)
            )
            if pending is not None:
                c.put(
                    node, m.ROLLOUT_PENDING_COUNT, pending, job=JOB, role="rollout", rank=str(rank)
                )

    return f


def _frozen(c: Cluster) -> int:
    return 20


def _held(c: Cluster) -> int:
    """The trainers' step stays where it is (not back to 20: that reads as a restart)."""
    return c.participants[(JOB, "trainer", 0)].step


def _moving(c: Cluster) -> int:
    return 20 + int(c.now) // 3 % 10_000


def test_the_deadlock_is_one_job_incident_naming_both_sides_restarting_the_rollouts() -> None:
    c = Cluster()
    det = CrossRoleDeadlockDetector(c.policy)
    c.run(30, _job("TRAIN", _moving, 1200.0), detector=det)
    res = c.run(SUSTAIN + 10, _job("COLLECT", _frozen, 0.0, pending=0), detector=det)
    fired = first_firing(res)
    assert fired is not None and SUSTAIN - 1 <= fired <= SUSTAIN + 2, fired
    [sig] = res[fired - 1]
    assert sig.kind is FaultKind.CROSS_ROLE_DEADLOCK and sig.suggested_tier is Tier.MEDIUM
    assert sig.subject.to_dict() == {"job": JOB, "role": "rollout"}
    assert sig.extra["trainers"] == ["trainer-0", "trainer-1"]
    assert sig.extra["rollouts"] == ["rollout-0", "rollout-1"]
    assert "waiting for rollout data" in sig.evidence.detail
    verdict = Classifier(c.policy).classify(sig, job_step=20)
    actions = choose_actions(policy=c.policy, classification=verdict, signal=sig, world=c.world())
    assert [(a.action.value, a.params.get("role"), a.params.get("rank")) for a in actions] == [
        ("restart_role", "rollout", None)
    ]


@pytest.mark.parametrize(
    "each",
    [
        _job("COLLECT", _frozen, 1100.0),  # the trainer waits, the rollouts generate
        _job("TRAIN", _moving, 0.0, pending=0),  # the rollouts idle, the trainer trains
        _job("COLLECT", _frozen, 0.0, pending=4),  # work queued: an engine dead in a worker
        _job("EVAL", _frozen, 0.0, pending=0),  # evaluating, not waiting for data
        _job("COLLECT", _frozen, 0.0, rollout_phase="DONE"),  # the rollouts finished
    ],
)
def test_each_side_alone_is_not_a_deadlock(each: Callable[[Cluster], None]) -> None:
    c = Cluster()
    det = CrossRoleDeadlockDetector(c.policy)
    c.run(30, _job("TRAIN", _moving, 1200.0), detector=det)
    assert first_firing(c.run(SUSTAIN * 2, each, detector=det)) is None


def test_a_wait_shorter_than_the_sustain_time_is_not_a_deadlock() -> None:
    c = Cluster()
    det = CrossRoleDeadlockDetector(c.policy)
    c.run(30, _job("TRAIN", _moving, 1200.0), detector=det)
    res = c.run(SUSTAIN - 20, _job("COLLECT", _frozen, 0.0), detector=det)
    res += c.run(20, _job("TRAIN", _moving, 1200.0), detector=det)
    res += c.run(SUSTAIN - 20, _job("COLLECT", _frozen, 0.0), detector=det)
    assert first_firing(res) is None


def test_the_waiting_trainers_are_not_also_hung() -> None:
    """Through the engine: the trainers' frozen step would be train_hang after 120 s; the
    deadlock explains it, so the job has one incident, not three."""
    c = Cluster()
    engine = PolicyEngine(c.policy)
    c.run(60, _job("ROLLOUT", _moving, 1200.0), engine=engine)
    decisions = c.run(300, _job("ROLLOUT", _frozen, 0.0), engine=engine)
    opened = {d.key for d in decisions if d.type == "open"}
    assert opened == {f"cross_role_deadlock:job={JOB}/role=rollout"}, opened


def test_rollouts_going_idle_after_the_trainers_froze_are_a_deadlock_not_a_hang() -> None:
    """The race the reference job showed: the trainers' step freezes in ROLLOUT (a hang phase
    too) while the rollouts generate for 95 s more, then idle. train_hang's 120 s clock runs
    from the freeze, the deadlock's window from the idleness (95 + 90 s): train_hang defers to
    the deadlock building up, and the job gets the deadlock alone, restarting the rollouts."""
    c = Cluster()
    engine = PolicyEngine(c.policy)
    c.run(60, _job("ROLLOUT", _moving, 1200.0), engine=engine)
    decisions = c.run(95, _job("ROLLOUT", _held, 1200.0), engine=engine)
    decisions += c.run(SUSTAIN + 40, _job("ROLLOUT", _held, 0.0, pending=0), engine=engine)
    opened = {d.key for d in decisions if d.type == "open"}
    assert opened == {f"cross_role_deadlock:job={JOB}/role=rollout"}, opened


def test_train_hang_clock_stops_while_the_rollouts_are_starved_and_resumes_after() -> None:
    """50 s frozen while the rollouts generate count; 300 s waiting on starved rollouts do not
    (the deadlock's case, absent here); once a rollout works again and the step is still
    frozen, train_hang fires after the remaining 70 s of its 120 s."""
    c = Cluster()
    hang = TrainHangDetector(c.policy)
    c.run(60, _job("ROLLOUT", _moving, 1200.0), detector=hang)
    res = c.run(50, _job("ROLLOUT", _held, 1200.0), detector=hang)
    res += c.run(300, _job("ROLLOUT", _held, 0.0, pending=0), detector=hang)
    assert first_firing(res) is None
    fired = first_firing(c.run(100, _job("ROLLOUT", _held, 1200.0), detector=hang))
    assert fired is not None and 68 <= fired <= 72, fired


@pytest.mark.parametrize(
    ("tokens", "pending"),
    [(1100.0, None), (0.0, 4.0)],  # the rollouts generate; work is queued for them
)
def test_a_waiting_trainer_is_hung_on_time_while_its_rollouts_are_busy(
    tokens: float,
    pending: float | None,
) -> None:
    c = Cluster()
    hang = TrainHangDetector(c.policy)
    c.run(60, _job("ROLLOUT", _moving, 1200.0), detector=hang)
    res = c.run(200, _job("ROLLOUT", _held, tokens, pending=pending), detector=hang)
    fired = first_firing(res)
    assert fired is not None and 118 <= fired <= 122, fired
