"""train_hang from the very first step: the first-step budget, and its must-not-fire twins."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.policy.classifier import Classifier
from app.policy.detectors.hang import TrainHangDetector
from app.policy.policy_file import default_policy, parse_policy
from app.policy.signals import FaultKind, Tier

from .._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(60)
BUDGET = 420  # detection.trainer.first_step_budget_seconds.trainer


def _at(phase: str, step: int, rank: int = 0) -> Callable[[Cluster], None]:
    def each(c: Cluster) -> None:
        c.participant("trainer", rank, "n0", phase=phase, step=step)

    return each


def _fired(results: list) -> int | None:
    return next((i + 1 for i, sigs in enumerate(results) if sigs), None)


def test_a_job_hung_in_its_first_step_is_train_hang_at_the_budget_heavy() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    res = c.run(BUDGET + 10, _at("TRAIN", 0), detector=det)
    fired = _fired(res)
    assert fired is not None and BUDGET - 1 <= fired <= BUDGET + 1, fired
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.TRAIN_HANG and sig.extra["first_step"] is True
    assert sig.extra["first_step_budget_seconds"] == BUDGET
    assert "has not finished its first step" in sig.evidence.detail
    assert "first-step budget 420s, policy" in sig.evidence.detail
    # A fault in the job's first step escalates (RobustRL): a person decides.
    assert Classifier(c.policy).classify(sig, job_step=0).tier is Tier.HEAVY


def test_after_a_restart_the_budget_counts_from_the_end_of_the_start_up_grace() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    c.run(40, lambda c: _at("TRAIN", 100 + int(c.now) % 1000 // 2)(c), detector=det)
    c.run(5, _at("STARTING", 80), detector=det)  # restarted from the checkpoint of step 80
    grace = c.policy.detection.startup.grace_seconds("trainer")
    res = c.run(int(grace) + BUDGET + 10, _at("TRAIN", 80), detector=det)
    fired = _fired(res)
    assert fired is not None and grace + BUDGET - 8 <= fired <= grace + BUDGET + 2, fired
    sig = res[fired - 1][0]
    assert sig.step == 80 and Classifier(c.policy).classify(sig, job_step=80).tier is Tier.MEDIUM


def test_a_long_model_load_reported_as_starting_never_counts() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    # 15 minutes loading weights, reported as STARTING: none of it counts
    assert _fired(c.run(900, _at("STARTING", 0), detector=det)) is None
    assert _fired(c.run(BUDGET - 30, _at("TRAIN", 0), detector=det)) is None
    # A load within the start-up grace (100 s of 120): the budget starts when the grace ends.
    c2 = Cluster()
    det2 = TrainHangDetector(c2.policy)
    c2.run(100, _at("STARTING", 0, rank=1), detector=det2)
    assert _fired(c2.run(20 + BUDGET - 10, _at("TRAIN", 0, rank=1), detector=det2)) is None


def test_a_long_but_advancing_first_step_within_the_budget_is_not_a_hang() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    res = c.run(BUDGET - 20, _at("TRAIN", 0), detector=det)
    res += c.run(300, lambda c: _at("TRAIN", 1 + int(c.now) % 100000 // 20)(c), detector=det)
    assert _fired(res) is None


def test_a_participant_first_seen_mid_run_is_judged_by_its_pace_only() -> None:
    """A server that starts watching a running job has not seen its start: a long step in
    progress is not a first step (its pace judges it once known)."""
    c = Cluster()
    det = TrainHangDetector(c.policy)
    assert _fired(c.run(BUDGET + 60, _at("TRAIN", 500), detector=det)) is None


def test_a_budget_the_job_declared_wins_over_the_policys() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)

    def each(c: Cluster) -> None:
        _at("TRAIN", 0)(c)
        c.put("n0", "participant_first_step_budget_seconds", 60, job=JOB, role="trainer", rank="0")

    res = c.run(80, each, detector=det)
    fired = _fired(res)
    assert fired is not None and 59 <= fired <= 61, fired
    assert "first-step budget 60s, declared by the job" in res[fired - 1][0].evidence.detail


def test_time_outside_hang_phases_pauses_the_first_step_clock() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    res = c.run(300, _at("TRAIN", 0), detector=det)
    res += c.run(600, _at("WEIGHT_SYNC", 0), detector=det)
    res += c.run(100, _at("TRAIN", 0), detector=det)
    assert _fired(res) is None


def test_the_budget_is_policy_per_role() -> None:
    data = default_policy().model_dump(mode="json")
    data["detection"]["trainer"]["first_step_budget_seconds"] = {"trainer": 30}
    c = Cluster(parse_policy(data))
    det = TrainHangDetector(c.policy)
    fired = _fired(c.run(40, _at("TRAIN", 0), detector=det))
    assert fired is not None and 29 <= fired <= 31
    data["detection"]["trainer"]["first_step_budget_seconds"] = {"trainer": 0}
    with pytest.raises(Exception, match="first_step_budget_seconds"):
        parse_policy(data)


def _process(pid: int, step: Callable[[Cluster], int]) -> Callable[[Cluster], None]:
    """Trainer 0 in TRAIN at ``step(c)``, its heartbeat written by process ``pid``."""

    def each(c: Cluster) -> None:
        _at("TRAIN", step(c))(c)
        c.put("n0", "participant_pid", pid, job=JOB, role="trainer", rank="0")

    return each


def _restarted_at_the_same_step(c: Cluster, det: TrainHangDetector) -> int:
    """Process 100 steps every 5 s for 60 s (its pace is known), then its own launcher restarts
    it faster than a tick, resumed at the step it was on: no start-up phase, no step back, only
    a new pid. Returns that step."""
    start = c.now
    c.run(60, _process(100, lambda c: 100 + int(c.now - start) // 5), detector=det)
    return 100 + int(c.now - start) // 5


def test_a_restart_seen_only_by_its_new_pid_gets_the_first_step_budget() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    step = _restarted_at_the_same_step(c, det)
    res = c.run(BUDGET + 10, _process(200, lambda c: step), detector=det)
    # Not the pace's 120 s counted from the old process's last step: the new one's budget.
    fired = _fired(res)
    assert fired is not None and BUDGET - 2 <= fired <= BUDGET + 1, fired
    sig = res[fired - 1][0]
    assert sig.extra["first_step"] is True and sig.step == step


def test_a_long_first_step_after_a_same_step_restart_is_not_a_hang() -> None:
    """Twin: the new process's first step takes 300 s (loading, warm-up: over the pace's 120 s
    limit, within the budget), then it steps on. Judged by the old process's pace, it fired."""
    c = Cluster()
    det = TrainHangDetector(c.policy)
    step = _restarted_at_the_same_step(c, det)
    start = c.now
    res = c.run(300, _process(200, lambda c: step), detector=det)
    res += c.run(
        200, _process(200, lambda c: step + 1 + int(c.now - start - 300) // 5), detector=det
    )
    assert _fired(res) is None


def test_the_same_pid_is_no_restart() -> None:
    """A process whose pid stays is judged by its pace, as before (120 s for a 5 s step)."""
    c = Cluster()
    det = TrainHangDetector(c.policy)
    step = _restarted_at_the_same_step(c, det)
    fired = _fired(c.run(200, _process(100, lambda c: step), detector=det))
    assert fired is not None and fired <= 121, fired
