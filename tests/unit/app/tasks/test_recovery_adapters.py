"""Recovery adapters against real run directories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from app.actions.machine import ActionSnapshot
from app.tasks import recovery_adapters as ra
from recovery.control import ControlMode, read_control
from recovery.supervision import hook
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


def test_restore_of_a_job_whose_checkpoints_are_its_framework_s_goes_to_its_launcher(
    tmp_path: Path, ctx: ra.ActionContext
) -> None:
    # A TRL job: no checkpoint engine directory; its launcher restarts it from the newest
    # complete state its integration finds (the hook gets restore_checkpoint, no path).
    hook = tmp_path / "hook.sh"
    hook.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "import json, sys; '
        f'print(json.dumps(sys.argv[1:]))" "$@"\n'
    )
    hook.chmod(0o755)
    out = ra.restore_checkpoint(
        ra.ActionContext(ctx.run_root, str(hook), 5), snap("restore_checkpoint")
    )
    assert out["checkpoint"] is None
    assert json.loads(out["launcher"]["stdout"]) == [
        "restore_checkpoint", "--job=j", "--node=n0", "--idempotency-key=inc7/s0/restore_checkpoint",
    ]  # fmt: skip


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
        "import json, sys, time\nif '--role=slow' in sys.argv: time.sleep(5)\n"
        "print(json.dumps(sys.argv[1:]))\nsys.exit(3 if '--role=bad' in sys.argv else 0)\n"
    )
    sh = tmp_path / "hook.sh"
    sh.write_text(f'#!/bin/sh\nexec {sys.executable} {hook} "$@"\n')
    sh.chmod(0o755)
    ok = ra.ActionContext(ctx.run_root, str(sh), 2)
    out = ra.restart_role(ok, snap("restart_role", role="trainer", rank=1))
    # Each value joined to its option, one argv element each.
    assert json.loads(out["stdout"]) == [
        "restart_role", "--job=j", "--node=n0", "--role=trainer", "--rank=1",
        "--idempotency-key=inc7/s0/restart_role",
    ]  # fmt: skip
    # A value that looks like an option stays the value of its option.
    odd = ra.restart_job(ok, snap("restart_job", job="-h", away_from="--run-root=/tmp/x"))
    assert json.loads(odd["stdout"])[1:4] == [
        "--job=-h",
        "--node=n0",
        "--away-from=--run-root=/tmp/x",
    ]
    with pytest.raises(ra.ActionError, match="launcher exited 3"):
        ra.restart_role(ok, snap("restart_role", role="bad"))
    with pytest.raises(ra.TransientActionError, match="timed out after 2s"):
        ra.restart_job(ok, snap("restart_job", role="slow"))
    # A launcher that refused (exit 1) says why in its JSON answer: that reason is the error.
    hook.write_text(
        "import json, sys\n"
        "print(json.dumps({'ok': False, 'error': \"no process with role 'rollout' rank '0'\"}))\n"
        "sys.exit(1)\n"
    )
    with pytest.raises(ra.ActionError, match="launcher exited 1: no process with role 'rollout'"):
        ra.restart_role(ok, snap("restart_role", role="rollout", rank=0))


def test_the_joined_argv_through_the_real_hook_executable(tmp_path: Path) -> None:
    # RLGuard's own hook (argparse) takes --option=value; an option-looking role is its value.
    launcher = tmp_path / "hook"
    hook.write_hook(launcher, module="integrations.launch", run_root=tmp_path)
    ctx = ra.ActionContext(run_root=tmp_path, launcher=str(launcher), launcher_timeout=60)
    odd = ActionSnapshot(1, 7, "restart_role", "j", "n0", {"role": "-h", "rank": 0}, 1, "inc7/x")
    with pytest.raises(ra.ActionError, match="(?s)launcher exited 2: .*--role '-h' must be"):
        ra.restart_role(ctx, odd)
    plain = ActionSnapshot(1, 7, "restart_job", "j", "n0", {"extra": 1}, 1, "inc7/y")
    with pytest.raises(ra.ActionError, match="launcher exited 2: no running job 'j'"):
        ra.restart_job(ctx, plain)


def test_a_long_launcher_answer_keeps_its_end(tmp_path: Path, ctx: ra.ActionContext) -> None:
    """The outcome is at the end of what a launcher prints (a healed engine's stage line): the
    result keeps the last HOOK_OUTPUT_CHARS of stdout, a failure the last HOOK_ERROR_CHARS of
    stderr, so the error still fits the action's 2,000-character column with its end."""
    hook = tmp_path / "talky.py"
    hook.write_text(
        "import sys\nprint('x' * 9000)\nprint('rollout-1: readmitted at v7 0.1 s')\n"
        "print('y' * 9000, file=sys.stderr)\nprint('the reason', file=sys.stderr)\n"
        "sys.exit(1 if '--role=bad' in sys.argv else 0)\n"
    )
    sh = tmp_path / "talky.sh"
    sh.write_text(f'#!/bin/sh\nexec {sys.executable} {hook} "$@"\n')
    sh.chmod(0o755)
    talky = ra.ActionContext(ctx.run_root, str(sh), 10)
    out = ra.restart_role(talky, snap("restart_role", role="trainer", rank=1))
    assert len(out["stdout"]) == ra.HOOK_OUTPUT_CHARS
    assert out["stdout"].endswith("rollout-1: readmitted at v7 0.1 s")
    with pytest.raises(ra.ActionError) as err:
        ra.restart_role(talky, snap("restart_role", role="bad"))
    assert str(err.value).endswith("the reason") and len(str(err.value)) < 2000
