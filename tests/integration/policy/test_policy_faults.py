"""Control-plane faults: a worker kill -9'ed mid-action, Redis down for 30 s.

Both run on PostgreSQL + a Redis of our own (stopping it leaves the machine's Redis alone).
"""

from __future__ import annotations

import time

import pytest

from recovery.wal import WALStatus, WriteAheadLog
from tests.harness.stack import JOB, Stack

from .test_policy_scenarios import _action, _base_cluster, _succeeded

pytestmark = [pytest.mark.slow, pytest.mark.integration]

OUTAGE_SECONDS = 30


@pytest.mark.timeout(120)
def test_worker_killed_mid_action_completes_once_after_restart(redis_stack: Stack) -> None:
    stack = redis_stack
    stack.env["RLGUARD_TEST_LAUNCHER_SLEEP"] = "restart_role=4"
    stack.start_server()
    first = stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)
    stack.wait(
        lambda: any(
            c["event"] == "start" and c["action"] == "restart_role" for c in stack.launcher_calls()
        ),
        40,
        "the restart to begin",
    )
    stack.kill_worker(first)  # kill -9 the worker and its launcher child, mid-action
    inc = stack.incident("heartbeat_lost")
    action = _action(inc, "restart_role")
    assert action["status"] == "running" and action["attempts"] == 1
    dead_worker = action["worker"]
    time.sleep(1)  # the scenario: a live launcher would have finished by now (absence)
    # It really died mid-way (the stacks asked for before the restart are done; not the restart).
    assert not any(
        c["event"] == "done" and c["action"] == "restart_role" for c in stack.launcher_calls()
    )
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    done = stack.wait(
        lambda: _succeeded(stack, "heartbeat_lost", "restart_role"), 60, "the restart to complete"
    )
    action = _action(done, "restart_role")
    assert action["attempts"] == 2 and action["worker"] != dead_worker
    calls = [c for c in stack.launcher_calls() if c["action"] == "restart_role"]
    assert [c["event"] for c in calls] == ["start", "start", "done"]  # completed exactly once
    started = [e for e in done["timeline"] if e["type"] == "action_started"]
    assert len(started) == 2
    assert len([e for e in done["timeline"] if e["type"] == "action_succeeded"]) == 1


@pytest.mark.timeout(150)
def test_redis_down_30s_actions_wait_in_outbox_and_run_after(redis_stack: Stack) -> None:
    stack = redis_stack
    wal = WriteAheadLog(stack.run_dir() / "wal")
    wal.append("batch-3", "generate", data=b"prompt")
    wal.update_status("batch-3", WALStatus.EXECUTING)
    wal.close()
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()
    assert stack.redis is not None
    stack.redis.stop()
    down_at = time.monotonic()
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    stack.feeder.set("n0", "train_last_failed_step", 20, **t)
    stack.feeder.set("n0", "train_step_failures_total", 1, **t)
    stack.feeder.set("n1", "rollout_batch_timeouts_total", 1, job=JOB, role="rollout", rank="0")
    stack.wait(
        lambda: stack.incident("step_failed") and stack.incident("rollout_batch_timeout"),
        20,
        "incidents",
    )
    while time.monotonic() - down_at < OUTAGE_SECONDS:
        time.sleep(1)  # the scenario: the broker stays down for OUTAGE_SECONDS
    for kind in ("step_failed", "rollout_batch_timeout"):
        inc = stack.incident(kind)
        assert all(a["status"] == "pending" for a in inc["actions"]), inc[
            "actions"
        ]  # nothing lost, nothing sent
    request = stack.run_dir() / "recovery" / "requests" / "skip_step-20.json"
    assert not request.exists()
    stack.redis.start()  # same port, empty: only the outbox remembers the actions
    stack.wait(
        lambda: _succeeded(stack, "step_failed", "skip_failed_step"),
        60,
        "skip after Redis returned",
    )
    stack.wait(
        lambda: _succeeded(stack, "rollout_batch_timeout", "retry_rollout_batch"),
        60,
        "retry after Redis",
    )
    assert request.exists()
    wal = WriteAheadLog(stack.run_dir() / "wal")
    assert wal.get("batch-3").status is WALStatus.FAILED  # type: ignore[union-attr]
    wal.close()
    for kind in ("step_failed", "rollout_batch_timeout"):
        for a in stack.incident(kind)["actions"]:
            assert a["status"] == "succeeded" and a["attempts"] == 1
    assert stack.feeder.errors == []  # ingest never depended on the broker


@pytest.mark.timeout(120)
def test_local_recovery_failing_twice_escalates_to_whole_job_restart(redis_stack: Stack) -> None:
    stack = redis_stack
    stack.env["RLGUARD_TEST_LAUNCHER_FAIL"] = "restart_role"
    stack.run_dir()
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)

    def escalated():
        inc = stack.incident("heartbeat_lost")
        if inc is None or inc["tier"] != "heavy":
            return None
        safe = _action(inc, "enter_safe_mode")
        return inc if safe is not None and safe["status"] == "succeeded" else None

    inc = stack.wait(escalated, 60, "escalation after two failed restarts")
    restarts = [a for a in inc["actions"] if a["action"] == "restart_role"]
    assert [a["status"] for a in restarts] == ["failed", "failed"]
    assert "launcher exited 3" in (restarts[0]["error"] or "")
    types = [e["type"] for e in inc["timeline"]]
    assert types.count("action_failed") == 2
    assert types.index("recovery_retry") < types.index("escalated")
    assert any("local recovery failed 2 times" in r for r in inc["reasons"])
    restart_job = _action(inc, "restart_job")
    assert restart_job["status"] == "pending_approval"  # the whole-job restart waits for a person
    assert not any(c["action"] == "restart_job" for c in stack.launcher_calls())
