"""A trainer waiting for its rollout engine to come back reports ``WAIT_ENGINE``, a phase the
hang detector does not count: RLGuard heals the engine and leaves the trainer alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.policy.policy_file import TrainerDetection
from integrations.trl.callback import TRAIN, WAIT_ENGINE, RLGuardCallback, waiting_for_engine
from recovery.report import heartbeat_path, read_heartbeat

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _phase(run_dir: Path) -> str:
    beat = read_heartbeat(heartbeat_path(run_dir, "trainer", 0)) or {}
    return str(beat.get("phase"))


def test_the_wait_is_reported_and_the_phase_before_it_put_back(tmp_path: Path) -> None:
    callback = RLGuardCallback(tmp_path, rank=0, job="j")
    try:
        callback._set_phase(TRAIN, force=True)
        with waiting_for_engine():
            assert _phase(tmp_path) == WAIT_ENGINE
        assert _phase(tmp_path) == TRAIN
    finally:
        callback.reporter.close()


def test_outside_a_step_nothing_changes(tmp_path: Path) -> None:
    callback = RLGuardCallback(tmp_path, rank=0, job="j")
    try:
        with waiting_for_engine():  # the trainer is still starting (INIT)
            assert _phase(tmp_path) == "INIT"
        assert _phase(tmp_path) == "INIT"
    finally:
        callback.reporter.close()


def test_the_hang_detector_does_not_count_the_wait() -> None:
    assert WAIT_ENGINE not in TrainerDetection().hang_phases
    assert WAIT_ENGINE not in TrainerDetection().active_phases
