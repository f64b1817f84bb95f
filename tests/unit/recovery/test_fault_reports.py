"""Faults the job reports itself: HeartbeatReporter's fault counters and PhaseMachine feeding them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from recovery.phases import Event, Phase, PhaseConfig, PhaseError, PhaseMachine
from recovery.report import HeartbeatError, HeartbeatReporter
from recovery.statelog import StateLog, StateLogError, StateLogWriteError, read_state_log


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def read(rep: HeartbeatReporter) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(rep.path.read_text())
    return doc


def faults(doc: dict[str, Any]) -> tuple[Any, ...]:
    return (
        doc["train_step_failures_total"],
        doc["train_last_failed_step"],
        doc["rollout_batch_timeouts_total"],
        doc["stale_shards"],
        doc["state_log_write_errors_total"],
    )


def test_fault_records_are_written_at_once_despite_the_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=clock, interval=60)
    rep.update(step=5)  # first write
    assert faults(read(rep)) == (0, None, 0, [], 0)
    clock.now += 1
    assert rep.record_step_failure(7)
    assert faults(read(rep)) == (1, 7, 0, [], 0)
    assert rep.record_step_failure(9)
    assert rep.record_rollout_timeout()
    assert rep.record_state_log_error()
    assert rep.set_shard_stale("rank3", True)
    assert faults(read(rep)) == (2, 9, 1, ["rank3"], 1)
    assert not rep.set_shard_stale("rank3", True)  # no change, no write
    assert rep.set_shard_stale("rank1", True)
    assert read(rep)["stale_shards"] == ["rank1", "rank3"]
    assert rep.set_shard_stale("rank3", False)
    assert rep.set_shard_stale("rank1", False)
    assert read(rep)["stale_shards"] == []


def test_checkpoint_errors_are_counted_and_written_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=clock, interval=60)
    rep.update(step=5)
    assert read(rep)["checkpoint_write_errors_total"] == 0
    assert rep.record_checkpoint_error() and rep.record_checkpoint_error()
    doc = read(rep)
    assert doc["checkpoint_write_errors_total"] == 2
    assert faults(doc) == (0, None, 0, [], 0)  # the other counters are not touched


def test_snapshot_persist_errors_are_counted_apart_with_the_last_dir_and_error(
    tmp_path: Path,
) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock(), interval=60)
    rep.update(step=5)
    assert rep.record_snapshot_persist_error("/runs/a/snapshots/rank-0", "[Errno 13] denied")
    assert rep.record_snapshot_persist_error("/x" * 100, "e" * 300)
    doc = read(rep)
    assert doc["snapshot_persist_errors_total"] == 2
    assert doc["checkpoint_write_errors_total"] == 0  # the job's own checkpoints: untouched
    last = doc["snapshot_persist_last_error"]
    assert last == {"dir": ("/x" * 100)[-120:], "error": "e" * 120}  # label values: bounded
    restarted = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock(), interval=60)
    restarted.carry_over(doc)
    assert read(restarted)["snapshot_persist_errors_total"] == 2  # not a new error


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.record_step_failure(-1), "step must be >= 0, got -1"),
        (lambda r: r.record_step_failure("3"), "step must be an int or None, got '3'"),
        (lambda r: r.record_step_failure(None), "step must be an int >= 0, got None"),
        (lambda r: r.record_step_failure(True), "step must be an int or None, got True"),
        (lambda r: r.set_shard_stale("", True), "shard_id must be 1-64"),
        (lambda r: r.set_shard_stale("a-b", True), "shard_id must be 1-64 of .*got 'a-b'"),
        (lambda r: r.set_shard_stale("rank0", 1), "stale must be a bool, got 1"),
        (
            lambda r: r.restore_fault_counts(
                step_failures=-2, last_failed_step=None, rollout_timeouts=0
            ),
            "step_failures must be >= 0, got -2",
        ),
    ],
)
def test_bad_fault_input_is_refused_and_changes_nothing(
    tmp_path: Path, call: Any, message: str
) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock())
    rep.flush()
    before = rep.path.read_bytes()
    with pytest.raises(HeartbeatError, match=message):
        call(rep)
    rep.flush()
    assert faults(read(rep)) == faults(json.loads(before))


def test_restored_totals_never_move_a_counter_back(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock())
    assert rep.restore_fault_counts(step_failures=3, last_failed_step=11, rollout_timeouts=2)
    assert faults(read(rep)) == (3, 11, 2, [], 0)
    assert not rep.restore_fault_counts(step_failures=1, last_failed_step=4, rollout_timeouts=0)
    assert faults(read(rep)) == (3, 11, 2, [], 0)


def _machine(tmp_path: Path, clock: FakeClock, **kw: Any) -> tuple[PhaseMachine, HeartbeatReporter]:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=clock)
    log = StateLog(tmp_path / "state_log.jsonl", sync=False)
    machine = PhaseMachine(log, run_dir=tmp_path, clock=clock, reporter=rep, **kw)
    return machine, rep


def _to_train(machine: PhaseMachine) -> None:
    if machine.phase is Phase.INIT:
        machine.fire(Event.START)
        machine.fire(Event.PREPARED)
    machine.fire(Event.ROLLOUT_COMPLETE)
    machine.fire(Event.DATA_AVAILABLE)


def test_phase_machine_reports_failed_steps_and_rollout_timeouts(tmp_path: Path) -> None:
    clock = FakeClock()
    machine, rep = _machine(tmp_path, clock, config=PhaseConfig(rollout_timeout_sec=120))
    _to_train(machine)
    machine.fire(Event.TRAIN_STEP_DONE)
    machine.fire(Event.EVAL_DONE)  # step 1
    _to_train(machine)
    machine.fire(Event.TRAIN_STEP_FAILED, reason="CUDA out of memory")  # step 1 skipped
    assert machine.phase is Phase.ROLLOUT and machine.step == 2
    assert faults(read(rep))[:2] == (1, 1)
    # COLLECT past rollout_timeout_sec: the deadline fires retry_rollout, counted as a timeout
    machine.fire(Event.ROLLOUT_COMPLETE)
    clock.now += 121
    assert machine.tick() is Phase.ROLLOUT
    # a retry the caller asks for without a timeout is not a timeout
    machine.fire(Event.RETRY_ROLLOUT, reason="worker restarted")
    machine.fire(Event.RETRY_ROLLOUT, reason="batch deadline", timeout=True)
    assert machine.rollout_timeouts == 2
    assert faults(read(rep)) == (1, 1, 2, [], 0)
    last = read_state_log(tmp_path / "state_log.jsonl")[-1]
    assert (last.payload["rollout_timeouts"], last.payload["failed_steps"]) == (2, [1])


def test_a_failure_that_puts_the_job_in_safe_mode_is_reported_too(tmp_path: Path) -> None:
    clock = FakeClock()
    machine, rep = _machine(tmp_path, clock, first_step=0)
    _to_train(machine)
    machine.fire(Event.TRAIN_STEP_FAILED, reason="OOM in the first step")
    assert machine.phase is Phase.SAFE_MODE
    assert faults(read(rep))[:2] == (1, 0)


def test_resume_hands_the_runs_totals_to_a_new_reporter(tmp_path: Path) -> None:
    clock = FakeClock()
    machine, _ = _machine(tmp_path, clock)
    for _ in range(2):
        _to_train(machine)
        machine.fire(Event.TRAIN_STEP_DONE)
        machine.fire(Event.EVAL_DONE)
    _to_train(machine)
    machine.fire(Event.TRAIN_STEP_FAILED, reason="OOM")
    machine.fire(Event.RETRY_ROLLOUT, timeout=True)
    machine.state_log.close()
    # the process restarts: a fresh reporter starts at zero, resume restores the totals
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=clock)
    log = StateLog(tmp_path / "state_log.jsonl", sync=False)
    resumed = PhaseMachine.resume(log, run_dir=tmp_path, clock=clock, reporter=rep)
    assert resumed.failed_steps == (2,) and resumed.rollout_timeouts == 1
    assert faults(read(rep)) == (1, 2, 1, [], 0)


def test_a_refused_state_log_append_is_counted_and_reported(tmp_path: Path) -> None:
    clock = FakeClock()
    machine, rep = _machine(tmp_path, clock)
    machine.fire(Event.START)
    # The descriptor now refuses writes (EBADF), as a read-only remount would (EROFS).
    log = machine.state_log
    read_only = os.open(log.path, os.O_RDONLY)
    os.dup2(read_only, log._fd)
    os.close(read_only)
    with pytest.raises(StateLogWriteError, match="cannot append to state log"):
        machine.fire(Event.PREPARED)
    assert machine.phase is Phase.PREPARE  # nothing changed
    assert log.write_errors == 1
    assert faults(read(rep))[4] == 1
    # a bad payload is the caller's error, not the storage's: not counted
    with pytest.raises(StateLogError):
        log.append("", {})
    assert log.write_errors == 1 and faults(read(rep))[4] == 1


def test_a_reporter_that_cannot_write_does_not_stop_the_machine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    machine, rep = _machine(tmp_path, clock)
    for _ in range(2):
        _to_train(machine)
        machine.fire(Event.TRAIN_STEP_DONE)
        machine.fire(Event.EVAL_DONE)
    _to_train(machine)
    (tmp_path / "heartbeat").rename(tmp_path / "hb-gone")
    (tmp_path / "heartbeat").write_text("a file where the directory was")
    assert machine.fire(Event.TRAIN_STEP_FAILED, reason="OOM") is Phase.ROLLOUT
    assert "heartbeat report failed" in caplog.text


def test_reporter_must_be_a_heartbeat_reporter(tmp_path: Path) -> None:
    log = StateLog(tmp_path / "state_log.jsonl", sync=False)
    with pytest.raises(PhaseError, match="reporter must be a HeartbeatReporter or None, got 'x'"):
        PhaseMachine(log, reporter="x")  # type: ignore[arg-type]
