"""The heartbeat API's first-step budget and failed-samples counter, and the launcher's
declaration of a process's first-step budget."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recovery.launcher_reports import declare_launch, launch_declaration_path, report_starting
from recovery.report import HeartbeatError, HeartbeatReporter, read_heartbeat


def test_a_first_step_budget_is_written_at_once_and_kept_over_a_restart(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, job="j", interval=60)
    rep.update(phase="TRAIN", step=0, force=True)
    assert rep.set_first_step_budget(90)  # written at once, whatever the interval
    assert read_heartbeat(rep.path)["first_step_budget_seconds"] == 90.0
    report_starting(tmp_path, "trainer", 0, job="j", pid=77)  # the launcher restarts it
    assert read_heartbeat(rep.path)["first_step_budget_seconds"] == 90.0
    rep.set_first_step_budget(None)
    assert read_heartbeat(rep.path)["first_step_budget_seconds"] is None


@pytest.mark.parametrize("bad", [0, -5, math.inf, math.nan, "60", True])
def test_a_bad_first_step_budget_is_refused_and_changes_nothing(
    tmp_path: Path, bad: object
) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, job="j")
    rep.set_first_step_budget(30)
    with pytest.raises(HeartbeatError, match="first-step budget must be a positive number"):
        rep.set_first_step_budget(bad)  # type: ignore[arg-type]
    assert read_heartbeat(rep.path)["first_step_budget_seconds"] == 30.0


def test_failed_samples_count_up_and_survive_a_restart(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "rollout", 1, job="j", interval=0.001)
    rep.record_failed_samples()
    rep.record_failed_samples(4)
    rep.flush()
    assert read_heartbeat(rep.path)["rollout_failed_samples_total"] == 5
    with pytest.raises(HeartbeatError):
        rep.record_failed_samples(-1)
    report_starting(tmp_path, "rollout", 1, job="j", pid=78)
    assert read_heartbeat(rep.path)["rollout_failed_samples_total"] == 5


def test_finished_samples_count_up(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "rollout", 2, job="j", interval=0.001)
    rep.record_samples(16)
    rep.record_samples(4)
    rep.flush()
    assert read_heartbeat(rep.path)["rollout_samples_total"] == 20
    with pytest.raises(HeartbeatError):
        rep.record_samples(-2)


def test_the_launcher_declares_a_budget_for_one_process(tmp_path: Path) -> None:
    declare_launch(tmp_path, "trainer", 1, pid=1234, first_step_budget_seconds=45.0)
    path = launch_declaration_path(tmp_path, "trainer", 1)
    assert path == tmp_path / "launch" / "trainer-1.json"
    assert json.loads(path.read_text()) == {"pid": 1234, "first_step_budget_seconds": 45.0}
