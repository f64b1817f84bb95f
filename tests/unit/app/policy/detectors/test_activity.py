"""Trainer idleness in the active phase and rollout stalls (with the heartbeat check)."""

from __future__ import annotations

import pytest

from app.policy.detectors import (
    RolloutStallDetector,
    TrainerIdleDetector,
)
from app.policy.signals import FaultKind
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)

P = {"job": JOB, "role": "rollout", "rank": "0"}


# -- trainer idleness -------------------------------------------------------------------------


def _trainer_second(util: float, phase: str = "TRAIN"):
    def f(c: Cluster) -> None:
        for gpu in ("0", "1"):
            c.put("n0", m.GPU_UTILIZATION_RATIO, util, gpu=gpu)
        c.participant("trainer", 0, "n0", phase=phase)

    return f


def test_trainer_idle_in_train_fires_after_timeout() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    c.run(30, _trainer_second(0.9), detector=det)
    res = c.run(310, _trainer_second(0.0), detector=det)
    fired = first_firing(res)
    assert fired is not None and 300 <= fired <= 302
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.TRAINER_IDLE and sig.subject.node == "n0"
    assert sig.extra["ranks"] == [0]


def test_trainer_idle_during_weight_sync_does_not_fire() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    res = c.run(400, _trainer_second(0.0, phase="WEIGHT_SYNC"), detector=det)
    assert first_firing(res) is None


def test_trainer_idle_clock_starts_when_train_phase_starts() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)
    res = c.run(200, _trainer_second(0.0, phase="ROLLOUT"), detector=det)
    res += c.run(250, _trainer_second(0.0, phase="TRAIN"), detector=det)
    assert first_firing(res) is None
    res = c.run(60, _trainer_second(0.0, phase="TRAIN"), detector=det)
    assert first_firing(res) is not None


def test_trainer_busy_on_one_gpu_is_not_idle() -> None:
    c = Cluster()
    det = TrainerIdleDetector(c.policy)

    def second(c: Cluster) -> None:
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.put("n0", m.GPU_UTILIZATION_RATIO, 0.5, gpu="1")
        c.participant("trainer", 0, "n0")

    assert first_firing(c.run(400, second, detector=det)) is None


# -- rollout stall ----------------------------------------------------------------------------


def test_rollout_waiting_on_tool_does_not_fire() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def waiting(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 0.0, **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT")  # heartbeat fresh

    assert first_firing(c.run(300, waiting, detector=det)) is None


def test_rollout_down_fires_after_stall_and_missing_heartbeat() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def alive(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 900.0, **P)
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.5, gpu="0")  # the node keeps reporting
        c.participant("rollout", 0, "n1", phase="ROLLOUT")

    c.run(30, alive, detector=det)
    died = c.now

    def dead(c: Cluster) -> None:
        c.put("n1", m.GPU_UTILIZATION_RATIO, 0.0, gpu="0")
        c.participant("rollout", 0, "n1", phase="ROLLOUT", heartbeat=died)

    res = c.run(80, dead, detector=det)
    fired = first_firing(res)
    assert fired is not None and 59 <= fired <= 61
    assert res[fired - 1][0].kind is FaultKind.ROLLOUT_DOWN


def test_rollout_stall_on_a_silent_node_is_left_to_the_node_detector() -> None:
    c = Cluster()
    det = RolloutStallDetector(c.policy)

    def alive(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, 900.0, **P)
        c.participant("rollout", 0, "n1", phase="ROLLOUT")

    c.run(30, alive, detector=det)
    assert first_firing(c.run(120, lambda c: None, detector=det)) is None
