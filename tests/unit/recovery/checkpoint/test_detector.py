from __future__ import annotations

import pytest

from recovery.checkpoint.detector import FailureDetector, Health, HealthChange
from recovery.checkpoint.errors import CheckpointInputError


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_suspected_then_cleared_without_action() -> None:
    clock = FakeClock()
    det = FailureDetector(suspect_after=15, confirm_after=60, clock=clock)
    det.beat("rollout-0")
    clock.now += 14.9
    assert det.evaluate() == []
    clock.now += 0.2
    assert det.evaluate() == [
        HealthChange("rollout-0", Health.ALIVE, Health.SUSPECTED, pytest.approx(15.1))
    ]
    assert det.evaluate() == []  # reported once
    clock.now += 30
    back = det.beat("rollout-0")
    assert back is not None and back.new is Health.ALIVE and back.old is Health.SUSPECTED
    assert det.health("rollout-0") is Health.ALIVE
    clock.now += 50
    assert [c.new for c in det.evaluate()] == [Health.SUSPECTED]


def test_suspected_then_confirmed_after_observation_window() -> None:
    clock = FakeClock()
    det = FailureDetector(suspect_after=15, confirm_after=60, clock=clock)
    det.beat("trainer-0")
    det.beat("rollout-0")
    clock.now += 16
    det.beat("trainer-0")
    assert [(c.name, c.new) for c in det.evaluate()] == [("rollout-0", Health.SUSPECTED)]
    clock.now += 58  # 74 s silent: still only suspected
    det.beat("trainer-0")
    assert det.evaluate() == []
    clock.now += 2  # 76 s >= 15 + 60
    det.beat("trainer-0")
    assert [(c.name, c.old, c.new) for c in det.evaluate()] == [
        ("rollout-0", Health.SUSPECTED, Health.FAILED)
    ]
    assert det.health("trainer-0") is Health.ALIVE
    assert det.silent_for("rollout-0") == pytest.approx(76)


def test_a_long_silence_seen_late_goes_straight_to_failed() -> None:
    clock = FakeClock()
    det = FailureDetector(suspect_after=1, confirm_after=2, clock=clock)
    det.beat("x")
    clock.now += 10
    assert [c.new for c in det.evaluate()] == [Health.FAILED]
    assert det.beat("x") == HealthChange("x", Health.FAILED, Health.ALIVE, 10)


def test_unknown_and_forgotten() -> None:
    det = FailureDetector(clock=FakeClock())
    assert det.health("nobody") is None and det.silent_for("nobody") is None
    det.beat("a")
    det.forget("a")
    assert det.health("a") is None


@pytest.mark.parametrize("kwargs", [{"suspect_after": 0}, {"confirm_after": -1}])
def test_bad_windows(kwargs: dict[str, float]) -> None:
    with pytest.raises(CheckpointInputError, match="must be > 0"):
        FailureDetector(**kwargs)
