"""Faults the job reports itself reach the policy engine: a real PhaseMachine and
HeartbeatReporter in a run directory, a real agent process, a real server with its policy
scheduler (embedded SQLite), incidents read back through ``GET /api/v1/incidents``."""

from __future__ import annotations

from typing import Any

import pytest

from recovery.phases import Event, Phase, PhaseMachine
from recovery.report import HeartbeatReporter
from recovery.statelog import StateLog
from tests.harness.stack import JOB, Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _series(stack: Stack, name: str) -> list[dict[str, Any]]:
    body = stack.get(f"/api/v1/series?node=n1&name={name}&since=-60", stack.viewer)
    return list(body["data"])


def _latest(stack: Stack, name: str) -> float | None:
    data = _series(stack, name)
    return data[0]["points"][-1][1] if data and data[0]["points"] else None


def _held(stack: Stack, name: str, value: float, count: int = 1, span: float = 2.0) -> bool:
    """The server holds ``count`` series of ``name`` at ``value`` over ``span`` seconds.

    A counter's first value is only a baseline to the detectors; a rise sent before a policy
    tick (every 0.5 s) has seen the node and the baseline is no rise at all.
    """
    data = _series(stack, name)
    return len(data) == count and all(
        d["points"]
        and d["points"][-1][1] == value
        and d["points"][-1][0] - d["points"][0][0] >= span
        for d in data
    )


def _run_steps(machine: PhaseMachine, reporter: HeartbeatReporter, steps: int) -> None:
    for _ in range(steps):
        machine.fire(Event.ROLLOUT_COMPLETE)
        machine.fire(Event.DATA_AVAILABLE)
        machine.fire(Event.TRAIN_STEP_DONE)
        machine.fire(Event.EVAL_DONE)
        reporter.update(phase=machine.phase.value, step=machine.step, force=True)


def test_train_oom_is_a_light_incident_and_the_same_step_again_is_heavy(
    embedded_stack: Stack,
) -> None:
    stack = embedded_stack
    stack.start_server()
    run_dir = stack.run_dir(JOB)
    reporter = HeartbeatReporter(run_dir, "trainer", 0, job=JOB, interval=0.5)
    reporter.start_keepalive()
    log = StateLog(run_dir / "state_log.jsonl")
    machine = PhaseMachine(log, run_dir=run_dir, reporter=reporter)
    try:
        machine.fire(Event.START)
        machine.fire(Event.PREPARED)
        _run_steps(machine, reporter, 3)  # past the first-step window (a fault there is heavy)
        stack.start_agent("n1", run_dir)
        # The counters arrive at 0 first, so the failure below is an increase.
        stack.wait(lambda: _held(stack, "train_step_failures_total", 0), 40, "baseline")
        assert _latest(stack, "train_step") == 3
        assert stack.incidents() == []

        machine.fire(Event.ROLLOUT_COMPLETE)
        machine.fire(Event.DATA_AVAILABLE)
        assert machine.fire(Event.TRAIN_STEP_FAILED, reason="CUDA out of memory") is Phase.ROLLOUT
        reporter.update(phase=machine.phase.value, step=machine.step, force=True)
        light = stack.wait(lambda: stack.incident("step_failed"), 30, "step_failed incident")
        assert light["tier"] == "light", light
        assert light["subject"]["role"] == "trainer" and light["node"] == "n1"
        assert [a["action"] for a in light["actions"]] == ["skip_failed_step"]
        assert light["actions"][0]["params"]["step"] == 3
        assert _latest(stack, "train_last_failed_step") == 3

        # The job restores the checkpoint taken before step 3 and runs step 3 again: it fails
        # again. That is RobustRL's "same step failing again": heavy, whole-job restart plan.
        again = PhaseMachine(
            log, name="trainer-restored", run_dir=run_dir, reporter=reporter, first_step=3
        )
        again.fire(Event.START)
        again.fire(Event.PREPARED)
        again.fire(Event.ROLLOUT_COMPLETE)
        again.fire(Event.DATA_AVAILABLE)
        assert again.fire(Event.TRAIN_STEP_FAILED, reason="CUDA out of memory") is Phase.SAFE_MODE

        def escalated() -> dict[str, Any] | None:
            inc = stack.incident("step_failed")
            return inc if inc is not None and inc["tier"] == "heavy" else None

        heavy = stack.wait(escalated, 30, "step_failed escalated to heavy")
        assert heavy["id"] == light["id"]  # the same incident, escalated
        planned = {a["action"] for a in heavy["actions"]}
        assert {"enter_safe_mode", "restart_job"} <= planned
        types = [e["type"] for e in heavy["timeline"]]
        assert "escalated" in types
        assert _latest(stack, "train_step_failures_total") == 2
    finally:
        reporter.close()
        log.close()


def test_rollout_timeout_stale_shard_and_unwritable_state_log_open_their_incidents(
    embedded_stack: Stack,
) -> None:
    stack = embedded_stack
    stack.start_server()
    run_dir = stack.run_dir(JOB)
    trainer = HeartbeatReporter(run_dir, "trainer", 0, job=JOB, interval=0.5)
    rollout = HeartbeatReporter(run_dir, "rollout", 1, job=JOB, interval=0.5)
    for rep in (trainer, rollout):
        rep.update(phase="ROLLOUT", step=5, force=True)
        rep.start_keepalive()
    try:
        stack.start_agent("n1", run_dir)
        for name in (
            "rollout_batch_timeouts_total",
            "actor_shard_stale",
            "state_log_write_errors_total",
        ):
            stack.wait(lambda n=name: _held(stack, n, 0, count=2), 40, f"baseline of {name}")
        rollout.record_rollout_timeout()
        rollout.set_shard_stale("rank1", True)
        trainer.record_state_log_error()
        found = stack.wait(
            lambda: all(
                stack.incident(k)
                for k in ("rollout_batch_timeout", "shard_stale", "storage_unwritable")
            ),
            30,
            "three incidents",
        )
        assert found
        timeout = stack.incident("rollout_batch_timeout")
        stale = stack.incident("shard_stale")
        storage = stack.incident("storage_unwritable")
        assert timeout is not None and stale is not None and storage is not None
        assert (timeout["tier"], timeout["subject"]["role"]) == ("light", "rollout")
        assert (stale["tier"], stale["subject"]["role"]) == ("medium", "rollout")
        assert storage["tier"] == "heavy" and storage["subject"]["role"] == "trainer"
        assert "retry_rollout_batch" in {a["action"] for a in timeout["actions"]}
        assert "rebuild_shard" in {a["action"] for a in stale["actions"]}
        # The shard is live again: its incident resolves after the quiet period.
        rollout.set_shard_stale("rank1", False)
        stack.wait(
            lambda: (stack.incident("shard_stale") or {}).get("status") == "resolved",
            30,
            "shard_stale resolved",
        )
    finally:
        trainer.close()
        rollout.close()


def test_snapshot_persist_errors_open_checkpoint_write_errors_and_the_job_goes_on(
    embedded_stack: Stack,
) -> None:
    """The every-step snapshot path (integrations/trl/snapshots.py) reports a persist directory
    that is full: a medium, alert-only checkpoint_write_errors with the count, the directory and
    the last error, and no storage_unwritable (whose SAFE_MODE would stop the job)."""
    stack = embedded_stack
    stack.start_server()
    run_dir = stack.run_dir(JOB)
    trainer = HeartbeatReporter(run_dir, "trainer", 0, job=JOB, interval=0.5)
    trainer.update(phase="TRAIN", step=5, force=True)
    trainer.start_keepalive()
    persist_dir = str(run_dir / "snapshots" / "rank-0")
    try:
        stack.start_agent("n1", run_dir)
        for name in ("snapshot_persist_errors_total", "checkpoint_write_errors_total"):
            stack.wait(lambda n=name: _held(stack, n, 0), 40, f"baseline of {name}")
        for _ in range(3):  # one per snapshot: the disk stays full
            trainer.record_snapshot_persist_error(persist_dir, "[Errno 28] No space left on device")
        inc = stack.wait(lambda: stack.incident("checkpoint_write_errors"), 30, "the incident")
        assert inc["tier"] == "medium" and inc["actions"] == [], inc
        assert inc["subject"]["role"] == "trainer" and not inc["safe_mode"], inc
        extra = inc["evidence"]["extra"]
        # the count when it opened: the agent may have sent the three rises in one batch or more
        assert 1 <= extra["failed_persists"] <= 3, extra
        stack.wait(lambda: _latest(stack, "snapshot_persist_errors_total") == 3, 30, "all three")
        assert extra["directory"] == persist_dir[-120:]
        assert extra["last_error"] == "[Errno 28] No space left on device"
        assert persist_dir[-120:] in inc["evidence"]["evidence"]["detail"]
        assert _latest(stack, "checkpoint_write_errors_total") == 0
        assert stack.incident("storage_unwritable") is None
    finally:
        trainer.close()
