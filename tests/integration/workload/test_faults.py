"""Every fault kind of workload.chaos on the reference job, watched by the real stack (embedded
`rlguard up`: server + policy engine + Celery worker; a node agent with simulated GPUs; the
launcher as the launcher hook). For each fault: the incident's tier, the action the policy took,
and that training went on afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from recovery.control import ControlMode, read_control
from tests.harness import free_port, wait_for
from workload.chaos import Fault, inject
from workload.job import RunDir, read_events, read_json

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    s = DemoStack(tmp_path, free_port(), job="faults", steps=80, decode_ms=10.0, schedule=None)
    try:
        s.start_server()
        s.start_agent()
        s.start_job()
        yield s
    finally:
        s.stop()


def _wait(pred: Callable[[], Any], timeout: float, what: str, stack: DemoStack) -> Any:
    def logs() -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((stack.run_dir / "logs").glob("*.log"))
        )

    return wait_for(pred, timeout, what, interval=0.3, context=logs)


def _step(run: RunDir) -> int:
    return max((e["step"] for e in read_events(run) if e["kind"] == "step"), default=-1)


def _incident(stack: DemoStack, kind: str, after: float, **subject: str) -> dict[str, Any] | None:
    for inc in stack.incidents():
        opened = datetime.fromisoformat(inc["opened_at"].replace("Z", "+00:00")).timestamp()
        if (
            inc["kind"] == kind
            and opened >= after - 2
            and all(str(inc["subject"].get(k)) == v for k, v in subject.items())
        ):
            return stack.incident(inc["id"])
    return None


def _finished(stack: DemoStack, inc: dict[str, Any], action: str) -> str | None:
    detail = stack.incident(inc["id"])
    acts = [a for a in detail["actions"] if a["action"] == action]
    return acts[0]["status"] if acts and acts[0]["status"] in ("succeeded", "failed") else None


def _expect(
    stack: DemoStack, fault: Fault, kind: str, tier: str, action: str | None, **subject: str
) -> dict[str, Any]:
    run = RunDir(stack.run_dir)
    at = time.time()
    inject(run, fault)
    inc = _wait(
        lambda: _incident(stack, kind, at, **subject), 60, f"{kind} after {fault.fault}", stack
    )
    assert inc["tier"] == tier, inc
    if action is not None:
        status = _wait(lambda: _finished(stack, inc, action), 90, f"{action} for {kind}", stack)
        assert status == "succeeded", stack.incident(inc["id"])["actions"]
    else:
        assert inc["actions"] == []
    step = _step(run)
    _wait(lambda: _step(run) >= step + 2, 90, f"training to continue after {fault.fault}", stack)
    return inc


def test_every_fault_kind_is_classified_acted_on_and_training_continues(stack: DemoStack) -> None:
    run = RunDir(stack.run_dir)
    _wait(lambda: _step(run) >= 2, 120, "step 2 (past the first-step escalation window)", stack)

    _expect(
        stack,
        Fault("kill", role="rollout", rank=0),
        "heartbeat_lost",
        "medium",
        "restart_role",
        role="rollout",
        rank="0",
    )
    _expect(
        stack,
        Fault("hang", role="trainer"),
        "heartbeat_lost",
        "medium",
        "restart_role",
        role="trainer",
    )
    assert any(e["kind"] == "trainer_restored" for e in read_events(run))
    _expect(stack, Fault("xid", gpu=0, xid=79), "gpu_xid", "medium", "reschedule_batches", gpu="0")
    _expect(
        stack, Fault("ecc", gpu=1), "gpu_ecc_uncorrectable", "medium", "reschedule_batches", gpu="1"
    )

    stop = threading.Event()
    slow = threading.Thread(
        target=inject,
        args=(run, Fault("slow-statelog", ms=800, seconds=15)),
        kwargs={"stop": stop},
        daemon=True,
    )
    at = time.time()
    slow.start()
    inc = _wait(lambda: _incident(stack, "state_log_slow", at), 60, "state_log_slow", stack)
    assert inc["tier"] == "medium" and inc["actions"] == []  # alert-only medium
    stop.set()
    slow.join(15)

    # A fake CUDA OOM in a train step: the phase machine records and skips the step (light) and
    # the reporter's failure counter brings it to the server, which plans skip_failed_step.
    inc = _expect(stack, Fault("oom"), "step_failed", "light", "skip_failed_step")
    failed = [e["step"] for e in read_events(run) if e["kind"] == "step_failed"]
    assert len(failed) == 1 and inc["subject"].get("role") == "trainer"
    _wait(
        lambda: any(
            e["kind"] == "request_done" and e["step"] == failed[0] for e in read_events(run)
        ),
        30,
        "the trainer to acknowledge the skip request",
        stack,
    )

    state = read_json(run.root / "pids.json") or {}
    assert set(state) == {"trainer-0", "rollout-0", "rollout-1"}


def test_unwritable_checkpoints_are_reported_heavy_and_resume_after_approval(
    stack: DemoStack,
) -> None:
    """Checkpoint storage unusable: the rounds abort (the global version does not move), the
    trainer's heartbeat counts the failed saves, and the server opens storage_unwritable, heavy:
    SAFE_MODE at once, restore_checkpoint waiting for an approver. Once approved, the job restarts
    from its newest checkpoint and trains again, and checkpoints commit again."""
    run = RunDir(stack.run_dir)
    _wait(lambda: _step(run) >= 2, 120, "step 2 (past the first-step escalation window)", stack)
    at = time.time()
    inject(run, Fault("ckpt-unwritable", seconds=6))  # blocks while the storage is unusable
    assert [e for e in read_events(run) if e["kind"] == "checkpoint_failed"], (
        "no checkpoint failed while the directory was unusable"
    )
    inc = _wait(
        lambda: _incident(stack, "storage_unwritable", at, role="trainer"),
        60,
        "storage_unwritable",
        stack,
    )
    assert inc["tier"] == "heavy", inc
    assert inc["evidence"]["evidence"]["metric"] == "checkpoint_write_errors_total", inc["evidence"]
    assert (
        _wait(lambda: _finished(stack, inc, "enter_safe_mode"), 60, "enter_safe_mode", stack)
        == "succeeded"
    )
    assert read_control(run.root).mode is ControlMode.SAFE_MODE
    pending = _wait(
        lambda: [a for a in stack.pending_approvals() if a["incident_id"] == inc["id"]],
        30,
        "the approval request for restore_checkpoint",
        stack,
    )
    stopped_at = _step(run)
    r = stack.api(
        "POST", f"/api/v1/approvals/{pending[0]['id']}/approve", json={"comment": "storage is back"}
    )
    assert r.status_code == 200, r.text
    assert (
        _wait(lambda: _finished(stack, inc, "restore_checkpoint"), 90, "restore_checkpoint", stack)
        == "succeeded"
    )
    assert any(e["kind"] == "restart" for e in read_events(run) if e["ts"] > at)
    _wait(lambda: _step(run) >= stopped_at + 2, 90, "training to continue after the restore", stack)
    after = time.time()
    _wait(
        lambda: any(e["kind"] == "checkpoint" and e["ts"] > after for e in read_events(run)),
        60,
        "a checkpoint after the storage came back",
        stack,
    )
