"""Recovery adapters against real run directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.actions.machine import ActionSnapshot
from app.tasks import recovery_adapters as ra
from recovery.control import ControlMode, read_control
from recovery.wal import WALStatus, WriteAheadLog

pytestmark = pytest.mark.timeout(60)


def snap(action: str, job: str = "j", **params) -> ActionSnapshot:
    return ActionSnapshot(1, 7, action, job, "n0", params, 1, f"inc7/s0/{action}")


@pytest.fixture
def ctx(tmp_path: Path) -> ra.ActionContext:
    (tmp_path / "j").mkdir()
    return ra.ActionContext(run_root=tmp_path, launcher=None, launcher_timeout=5)


def test_safe_mode_is_written_once(ctx: ra.ActionContext) -> None:
    first = ra.enter_safe_mode(ctx, snap("enter_safe_mode", reason="storage_unwritable"))
    again = ra.enter_safe_mode(ctx, snap("enter_safe_mode"))
    state = read_control(ctx.run_root / "j")
    assert first == {"mode": "safe_mode", "revision": 1, "already": False}
    assert again["already"] is True and state.mode is ControlMode.SAFE_MODE and state.revision == 1
    assert "incident 7: storage_unwritable" in state.reason


@pytest.mark.parametrize("job", [None, "../etc", "a/b", "missing"])
def test_bad_or_missing_run_directory_is_an_action_error(ctx: ra.ActionContext, job) -> None:
    with pytest.raises(ra.ActionError, match="run directory|cannot name"):
        ra.enter_safe_mode(ctx, snap("enter_safe_mode", job=job))


def test_batch_retry_is_bounded_per_entry(ctx: ra.ActionContext) -> None:
    wal = WriteAheadLog(ctx.run_root / "j" / "wal")
    wal.append("b1", "generate", data=b"x")
    wal.update_status("b1", WALStatus.EXECUTING)
    wal.close()
    a = snap("retry_rollout_batch", timeout_sec=0.0, max_retries=1)
    assert ra.retry_rollout_batch(ctx, a) == {"failed_for_retry": ["b1"], "out_of_retries": []}
    wal = WriteAheadLog(ctx.run_root / "j" / "wal")
    assert wal.get("b1").status is WALStatus.FAILED
    wal.update_status("b1", WALStatus.EXECUTING)  # the job rescheduled it and it hung again
    wal.close()
    with pytest.raises(ra.ActionError, match=r"out of retries \(1\): b1"):
        ra.retry_rollout_batch(ctx, a)


def test_restore_needs_a_valid_checkpoint(ctx: ra.ActionContext) -> None:
    with pytest.raises(ra.ActionError, match="no checkpoint directory"):
        ra.restore_checkpoint(ctx, snap("restore_checkpoint"))
    (ctx.run_root / "j" / "checkpoints").mkdir()
    with pytest.raises(ra.ActionError, match="no valid checkpoint"):
        ra.restore_checkpoint(ctx, snap("restore_checkpoint"))


def test_rebuild_shard_without_snapshot_fails_clearly(ctx: ra.ActionContext) -> None:
    with pytest.raises(ra.ActionError, match="no verified snapshot|no shard snapshots"):
        ra.rebuild_shard(ctx, snap("rebuild_shard", rank=0))


def test_skip_step_request_is_idempotent(ctx: ra.ActionContext) -> None:
    a = snap("skip_failed_step", step=42, role="trainer", rank=0)
    assert ra.skip_failed_step(ctx, a)["already"] is False
    assert ra.skip_failed_step(ctx, a)["already"] is True
    body = json.loads(
        (ctx.run_root / "j" / "recovery" / "requests" / "skip_step-42.json").read_text()
    )
    assert body["step"] == 42
    with pytest.raises(ra.ActionError, match="needs the failed step"):
        ra.skip_failed_step(ctx, snap("skip_failed_step"))


def test_launcher_hook_exit_codes_and_timeouts(tmp_path: Path, ctx: ra.ActionContext) -> None:
    with pytest.raises(ra.ActionError, match="needs a launcher hook"):
        ra.restart_role(ctx, snap("restart_role", role="trainer", rank=1))
    hook = tmp_path / "hook.py"
    hook.write_text(
        "import sys, time\nif 'slow' in sys.argv: time.sleep(5)\n"
        "print(' '.join(sys.argv[1:]))\nsys.exit(3 if 'bad' in sys.argv else 0)\n"
    )
    sh = tmp_path / "hook.sh"
    sh.write_text(f'#!/bin/sh\nexec {sys.executable} {hook} "$@"\n')
    sh.chmod(0o755)
    ok = ra.ActionContext(ctx.run_root, str(sh), 2)
    out = ra.restart_role(ok, snap("restart_role", role="trainer", rank=1))
    assert out["stdout"].startswith(
        "restart_role --job j --node n0 --role trainer --rank 1 --idempotency-key"
    )
    with pytest.raises(ra.ActionError, match="launcher exited 3"):
        ra.restart_role(ok, snap("restart_role", role="bad"))
    with pytest.raises(ra.TransientActionError, match="timed out after 2s"):
        ra.restart_job(ok, snap("restart_job", role="slow"))
