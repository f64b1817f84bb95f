"""The job collector forwards a first-step budget (the process's own, or its launcher's for its
pid only) and the failed-samples counter, and the pid behind each heartbeat."""

from __future__ import annotations

from pathlib import Path

from agents.collectors.job import JobCollector
from recovery.launcher_reports import declare_launch
from recovery.report import HeartbeatReporter


def _value(tmp_path: Path, name: str) -> float | None:
    samples, _ = JobCollector(tmp_path).collect()
    found = [s["value"] for s in samples if s["name"] == name]
    return found[0] if found else None


def test_the_launchers_declaration_holds_for_its_pid_only(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, job="j", pid=4242)
    rep.update(phase="TRAIN", step=0, force=True)
    assert _value(tmp_path, "participant_first_step_budget_seconds") is None
    declare_launch(tmp_path, "trainer", 0, pid=4242, first_step_budget_seconds=90.0)
    assert _value(tmp_path, "participant_first_step_budget_seconds") == 90.0
    declare_launch(tmp_path, "trainer", 0, pid=9999, first_step_budget_seconds=90.0)
    assert _value(tmp_path, "participant_first_step_budget_seconds") is None  # another process
    rep.set_first_step_budget(30)  # the process's own wins
    assert _value(tmp_path, "participant_first_step_budget_seconds") == 30.0


def test_a_broken_declaration_is_ignored(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 1, job="j", pid=7)
    rep.update(phase="TRAIN", step=0, force=True)
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "trainer-1.json").write_text(
        '{"pid": 7, "first_step_budget_seconds": -3}'
    )
    assert _value(tmp_path, "participant_first_step_budget_seconds") is None
    (tmp_path / "launch" / "trainer-1.json").write_text("not json")
    assert _value(tmp_path, "participant_first_step_budget_seconds") is None


def test_failed_samples_are_forwarded(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "rollout", 0, job="j", interval=0.001)
    rep.update(phase="ROLLOUT", step=1, force=True)
    assert _value(tmp_path, "rollout_failed_samples_total") is None
    rep.record_failed_samples(3)
    rep.flush()
    assert _value(tmp_path, "rollout_failed_samples_total") == 3


def test_the_process_behind_the_heartbeat_is_forwarded(tmp_path: Path) -> None:
    """participant_pid: a restart shows as a new value even at the same step and phase."""
    HeartbeatReporter(tmp_path, "trainer", 0, job="j", pid=4242).update(
        phase="TRAIN", step=7, force=True
    )
    assert _value(tmp_path, "participant_pid") == 4242
    HeartbeatReporter(tmp_path, "trainer", 0, job="j", pid=4343).update(
        phase="TRAIN", step=7, force=True
    )
    assert _value(tmp_path, "participant_pid") == 4343
