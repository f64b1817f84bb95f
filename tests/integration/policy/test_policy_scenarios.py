"""Light, medium and heavy faults end to end: ingest → incident → action on real files.

Each test runs twice (``stack`` fixture): PostgreSQL + Redis with a real Celery worker, and the
embedded mode (SQLite + SQLAlchemy broker, no Redis) with the same worker.
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.version import VersionVector
from recovery.wal import WALStatus, WriteAheadLog
from tests.harness.stack import JOB, Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _action(inc: dict, name: str) -> dict | None:
    return next((a for a in inc["actions"] if a["action"] == name), None)


def _succeeded(stack: Stack, kind: str, action: str, job: str = JOB) -> dict | None:
    inc = stack.incident(kind, job)
    if inc is None:
        return None
    a = _action(inc, action)
    return inc if a is not None and a["status"] == "succeeded" else None


def _base_cluster(stack: Stack) -> None:
    f = stack.feeder
    f.participant("n0", "trainer", 0)
    f.participant("n0", "trainer", 1)
    f.participant("n1", "rollout", 0, phase="ROLLOUT")
    for rank in (0, 1):
        t = {"job": JOB, "role": "trainer", "rank": str(rank)}
        f.set("n0", "train_step_failures_total", 0, **t)
        f.set("n0", "state_log_write_errors_total", 0, **t)
    r = {"job": JOB, "role": "rollout", "rank": "0"}
    f.set("n1", "rollout_batch_timeouts_total", 0, **r)
    f.set("n1", "rollout_tokens_per_second", 900, **r)
    for node in ("n0", "n1"):
        f.set(node, "gpu_utilization_ratio", 0.8, gpu="0")


def test_light_and_medium_faults_recover_automatically(stack: Stack) -> None:
    run_dir = stack.run_dir()
    wal = WriteAheadLog(run_dir / "wal")
    wal.append("batch-7", "generate", data=b"prompt")
    wal.update_status("batch-7", WALStatus.EXECUTING)
    wal.close()
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    _base_cluster(stack)
    stack.feeder.start()
    stack.wait_baselines()  # the detectors saw every counter at its baseline
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    stack.feeder.set("n0", "train_last_failed_step", 20, **t)
    stack.feeder.set("n0", "train_step_failures_total", 1, **t)  # an OOM in step 20: light
    stack.feeder.set("n1", "rollout_batch_timeouts_total", 1, job=JOB, role="rollout", rank="0")
    stack.feeder.freeze_heartbeat("n0", JOB, "trainer", 1)  # trainer rank 1 died: medium

    light = stack.wait(
        lambda: _succeeded(stack, "step_failed", "skip_failed_step"), 40, "skip_failed_step"
    )
    assert light["tier"] == "light" and light["subject"]["rank"] == 0
    request = json.loads((run_dir / "recovery" / "requests" / "skip_step-20.json").read_text())
    assert request["step"] == 20 and request["action"] == "skip_failed_step"
    kinds = [e["type"] for e in light["timeline"]]
    assert kinds[:2] == ["opened", "action_planned"] and "action_succeeded" in kinds
    assert _action(light, "skip_failed_step")["queue"] == "node.n0"

    retried = stack.wait(
        lambda: _succeeded(stack, "rollout_batch_timeout", "retry_rollout_batch"), 40, "batch retry"
    )
    assert _action(retried, "retry_rollout_batch")["result"]["failed_for_retry"] == ["batch-7"]
    wal = WriteAheadLog(run_dir / "wal")
    entry = wal.get("batch-7")
    wal.close()
    assert (
        entry is not None and entry.status is WALStatus.FAILED and "retry 1" in (entry.error or "")
    )

    medium = stack.wait(
        lambda: _succeeded(stack, "heartbeat_lost", "restart_role"), 40, "restart_role"
    )
    assert medium["tier"] == "medium"
    restarts = [
        c for c in stack.launcher_calls() if c["action"] == "restart_role" and c["event"] == "done"
    ]
    assert [(c["opts"]["--role"], c["opts"]["--rank"]) for c in restarts] == [("trainer", "1")]
    assert not any(c["action"] == "restart_job" for c in stack.launcher_calls())  # only the role
    # one incident per fault, however many ticks saw it
    assert len([i for i in stack.incidents() if i["kind"] == "heartbeat_lost"]) == 1
    # the dead trainer comes back: the medium incident resolves after the quiet period
    stack.feeder.participant("n0", "trainer", 1)
    stack.wait(lambda: stack.incident("heartbeat_lost")["status"] == "resolved", 30, "resolution")
    assert stack.feeder.errors == []


def _checkpoint(run_dir) -> str:
    eng = CheckpointEngine(run_dir / "checkpoints")
    state = {
        "model": {"w": torch.arange(4.0)},
        "optimizer": {"m": torch.zeros(4)},
        "lr_scheduler": {"lr": 0.1},
        "step": 18,
        "inference_weight_version": 18,
        "generation_config": {"t": 1.0},
    }
    eng.save(state, version=VersionVector(18, 18)).wait_finished(60)
    eng.close(60)
    info = CheckpointEngine(run_dir / "checkpoints").latest()
    assert info is not None
    return str(info.path)


def _control_mode(run_dir) -> str | None:
    from app.tasks.recovery_adapters import read_mode

    return read_mode(run_dir)


def test_heavy_waits_for_approval_approve_runs_reject_does_not(stack: Stack) -> None:
    jobs = {"approve": "grpo-a", "reject": "grpo-b"}
    ckpt = {name: _checkpoint(stack.run_dir(job)) for name, job in jobs.items()}
    stack.start_server()
    stack.start_worker("--node", "n0", "--node", "n1", "--cluster")
    f = stack.feeder
    for job in jobs.values():
        f.participant("n0", "trainer", 0, job=job)
        f.participant("n1", "rollout", 0, job=job, phase="ROLLOUT")
        f.set("n0", "state_log_write_errors_total", 0, job=job, role="trainer", rank="0")
    f.start()
    stack.wait_baselines()
    for job in jobs.values():  # the run directory stopped being writable: heavy
        f.set("n0", "state_log_write_errors_total", 3, job=job, role="trainer", rank="0")

    def safe_mode_everywhere(job: str):
        inc = stack.incident("storage_unwritable", job)
        if inc is None or not inc["safe_mode"]:
            return None
        safe = [a for a in inc["actions"] if a["action"] == "enter_safe_mode"]
        return inc if len(safe) == 2 and all(a["status"] == "succeeded" for a in safe) else None

    incs = {
        name: stack.wait(lambda j=job: safe_mode_everywhere(j), 40, f"SAFE_MODE for {job}")
        for name, job in jobs.items()
    }
    for name, job in jobs.items():
        inc = incs[name]
        assert inc["tier"] == "heavy"
        assert sorted(a["node"] for a in inc["actions"] if a["action"] == "enter_safe_mode") == [
            "n0",
            "n1",
        ]
        assert _control_mode(stack.run_dir(job)) == "safe_mode"
        restore = _action(inc, "restore_checkpoint")
        assert restore["status"] == "pending_approval" and restore["queue"] == "cluster"
    pending = stack.get("/api/v1/approvals?status=pending", stack.viewer)
    by_incident = {a["incident_id"]: a for a in pending}
    approval = {name: by_incident[incs[name]["id"]] for name in jobs}
    time.sleep(2)  # nothing runs without a decision
    for job in jobs.values():
        assert (
            _action(stack.incident("storage_unwritable", job), "restore_checkpoint")["status"]
            == "pending_approval"
        )
        assert not (stack.run_dir(job) / "recovery" / "requests").exists()

    # a viewer may not decide; an unknown approval is 404; an approver may
    r = stack.post(
        f"/api/v1/approvals/{approval['approve']['id']}/approve",
        stack.viewer,
        json={"comment": "x"},
    )
    assert r.status_code == 403
    assert stack.post("/api/v1/approvals/999999/approve", json={}).status_code == 404
    r = stack.post(
        f"/api/v1/approvals/{approval['approve']['id']}/approve", json={"comment": "restore it"}
    )
    assert (
        r.status_code == 200
        and r.json()["status"] == "approved"
        and r.json()["decided_by"] == "alice"
    )
    r = stack.post(
        f"/api/v1/approvals/{approval['reject']['id']}/reject", json={"comment": "not now"}
    )
    assert r.status_code == 200 and r.json()["status"] == "rejected"
    # a decision is final
    again = stack.post(
        f"/api/v1/approvals/{approval['approve']['id']}/reject", json={"comment": "changed my mind"}
    )
    assert again.status_code == 409 and "already approved by alice" in again.json()["detail"]

    done = stack.wait(
        lambda: _succeeded(stack, "storage_unwritable", "restore_checkpoint", jobs["approve"]),
        40,
        "restore",
    )
    assert _action(done, "restore_checkpoint")["result"]["checkpoint"] == ckpt["approve"]
    req = json.loads(
        next(
            (stack.run_dir(jobs["approve"]) / "recovery" / "requests").glob("restore-*.json")
        ).read_text()
    )
    assert req["checkpoint"] == ckpt["approve"]
    stack.wait(
        lambda: stack.incident("storage_unwritable", jobs["approve"])["status"] == "resolved",
        20,
        "resolved",
    )
    types = [e["type"] for e in stack.incident("storage_unwritable", jobs["approve"])["timeline"]]
    assert (
        types.index("approval_requested")
        < types.index("approval_granted")
        < types.index("resolved")
    )

    rejected = stack.incident("storage_unwritable", jobs["reject"])
    assert _action(rejected, "restore_checkpoint")["status"] == "cancelled"
    assert rejected["status"] == "open" and rejected["safe_mode"]
    note = next(e for e in rejected["timeline"] if e["type"] == "approval_rejected")
    assert note["actor"] == "user:alice" and "SAFE_MODE" in note["detail"]["note"]
    assert _control_mode(stack.run_dir(jobs["reject"])) == "safe_mode"
    assert not (stack.run_dir(jobs["reject"]) / "recovery" / "requests").exists()
    assert stack.get("/api/v1/approvals?status=pending", stack.viewer) == []
    # the counter episode that opened the restored job's incident is still being reported (its
    # error window has not passed): it must not open a second incident, in any of a few ticks
    time.sleep(1.5)  # the scenario: absence over three policy ticks
    restored = [
        i
        for i in stack.incidents()
        if i["kind"] == "storage_unwritable" and i["job"] == jobs["approve"]
    ]
    assert [i["status"] for i in restored] == ["resolved"], restored
