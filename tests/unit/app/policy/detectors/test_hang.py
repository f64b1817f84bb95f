"""train_hang: the step of a trainer in an active phase stopped advancing for
max(hang_min_seconds, hang_step_factor x its median step time)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.policy.detectors.hang import TrainHangDetector
from app.policy.engine import PolicyEngine
from app.policy.policy_file import PolicyFileError, default_policy, parse_policy
from app.policy.signals import FaultKind, Tier

from .._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(30)


def _stepping(every: int, phase: str = "TRAIN") -> Callable[[Cluster], None]:
    """A trainer (rank 0 on n0) whose step advances every ``every`` seconds."""
    clock = [0]

    def each(c: Cluster) -> None:
        clock[0] += 1
        c.participant("trainer", 0, "n0", phase=phase, step=100 + clock[0] // every)

    return each


def _stuck(phase: str = "TRAIN", step: int | None = None) -> Callable[[Cluster], None]:
    def each(c: Cluster) -> None:
        if step is None:
            c.participant(
                "trainer", 0, "n0", phase=phase, step=c.participants[(JOB, "trainer", 0)].step
            )
        else:
            c.participant("trainer", 0, "n0", phase=phase, step=step)

    return each


def _fired(results: list) -> int | None:
    return next((i + 1 for i, sigs in enumerate(results) if sigs), None)


def test_a_stuck_step_fires_after_the_minimum_and_names_its_evidence() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    c.run(30, _stepping(3), detector=det)  # 3 s steps: 10 x median = 30 s < the 120 s minimum
    res = c.run(130, _stuck(), detector=det)
    fired = _fired(res)
    assert fired is not None and 118 <= fired <= 121
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.TRAIN_HANG and sig.suggested_tier is Tier.MEDIUM
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}
    assert sig.step == c.participants[(JOB, "trainer", 0)].step
    assert "median step 3.0s" in sig.evidence.detail and "= 120s" in sig.evidence.detail


def test_slow_steps_get_ten_times_their_median() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    c.run(100, _stepping(20), detector=det)  # 20 s steps: 10 x 20 = 200 s
    res = c.run(215, _stuck(), detector=det)
    fired = _fired(res)
    assert fired is not None and 180 <= fired <= 201  # the stall began up to one step earlier


@pytest.mark.parametrize("phase", ["EVAL", "SAVE", "WEIGHT_SYNC", "SAFE_MODE", "EXITED", "DONE"])
def test_time_outside_active_phases_does_not_count(phase: str) -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    c.run(30, _stepping(3), detector=det)
    res = c.run(400, _stuck(phase), detector=det)
    res += c.run(100, _stuck("TRAIN"), detector=det)  # back in TRAIN: its clock starts there
    assert _fired(res) is None


def test_before_the_pace_is_known_only_the_first_step_budget_judges() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    # A first step of 400 s (compilation, warm-up): within the 420 s first-step budget.
    assert _fired(c.run(400, _stuck(step=0), detector=det)) is None
    c.run(30, _stepping(3), detector=det)
    # Restarted: back to an older step (resume from a checkpoint), a long first step again,
    # counted from the end of its start-up grace (120 s after it was seen STARTING).
    c.run(5, _stuck("STARTING", step=50), detector=det)
    assert _fired(c.run(400, _stuck(step=50), detector=det)) is None


def test_a_silent_node_is_not_a_hang() -> None:
    c = Cluster()
    det = TrainHangDetector(c.policy)
    c.run(30, _stepping(3), detector=det)
    last = c.now
    res = c.run(200, lambda c: c.node_seen.__setitem__("n0", last), detector=det)
    assert _fired(res) is None


def test_a_sigstopped_trainer_is_one_incident_train_hang_not_heartbeat_lost() -> None:
    data = default_policy().model_dump(mode="json")
    data["detection"]["trainer"].update(hang_min_seconds=5, hang_step_factor=2)
    data["detection"]["heartbeat"].update(suspect_seconds=2, confirm_seconds=3)
    c = Cluster(parse_policy(data))
    engine = PolicyEngine(c.policy)
    c.run(20, _stepping(1), engine=engine)
    frozen = c.now

    def stopped(c: Cluster) -> None:  # SIGSTOP: step, phase and heartbeat all stop
        current = c.participants[(JOB, "trainer", 0)]
        c.participant("trainer", 0, "n0", step=current.step, heartbeat=frozen)

    decisions = c.run(30, stopped, engine=engine)
    opened = [d for d in decisions if d.type.value == "open"]
    assert [d.kind for d in opened] == [FaultKind.TRAIN_HANG]
    assert [a.action.value for a in opened[0].actions] == ["restart_role"]


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("hang_step_factor", 0.5, "detection.trainer.hang_step_factor"),
        ("hang_min_seconds", 0, "detection.trainer.hang_min_seconds"),
        ("hang_min_steps", 0, "detection.trainer.hang_min_steps"),
        ("hang_after", 3, "detection.trainer.hang_after: unknown key"),
    ],
)
def test_bad_hang_settings_are_refused_by_name(key: str, value: float, needle: str) -> None:
    data = default_policy().model_dump(mode="json")
    data["detection"]["trainer"][key] = value
    with pytest.raises(PolicyFileError, match=needle.replace(".", r"\.")):
        parse_policy(data)
