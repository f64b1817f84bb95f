"""Train a real torch model, checkpoint, train more, crash (SIGKILL), restore: parameters,
optimizer state, scheduler and step equal the checkpoint bit for bit, the job continues exactly
as it did before the crash, and the transient state to clear is reported."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.restore import restore
from recovery.checkpoint.version import VersionVector
from tests.harness.training_state import assert_same
from tests.integration.checkpoint._torch_job import build, train_step

from .procs import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
N, M = 20, 7


def test_crash_and_restore_is_bit_exact(tmp_path: Path) -> None:
    root, ref = tmp_path / "ckpt", tmp_path / "ref"
    ref.mkdir()
    job = subprocess.run(
        [sys.executable, "-m", "tests.integration.checkpoint._torch_job", str(root), str(ref), str(N), str(M)],
        cwd=REPO, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert job.returncode == -signal.SIGKILL, job.stderr
    assert f"trained to {N + M}" in job.stdout

    result = restore(
        CheckpointEngine(root),
        participants={
            "trainer": VersionVector(N + M, (N + M) // 3),
            "rollout-0": VersionVector(N, 6),
        },
    )
    assert result.target == VersionVector(N, N // 3)
    assert result.action_for("trainer") == "rollback" and result.action_for("rollout-0") == "keep"
    assert "kv_cache" in result.transient_to_clear
    assert "dataloader_position" in result.transient_to_clear
    assert "kv_cache" not in result.state and "dataloader_position" not in result.state
    assert result.checkpoint.weight_versions.step_for_version(6) == 18

    torch.set_num_threads(1)
    model, opt, sched = build()
    model.load_state_dict(result.state["model"])
    opt.load_state_dict(result.state["optimizer"])
    sched.load_state_dict(result.state["lr_scheduler"])
    expected = torch.load(ref / "ref.pt", weights_only=True)
    assert_same(expected["model"], model.state_dict())
    assert_same(expected["optimizer"], opt.state_dict())
    assert_same(expected["lr_scheduler"], sched.state_dict())
    assert result.state["step"] == N
    assert_same(expected["experience_buffer"], result.state["experience_buffer"])

    # Training on from the restored state repeats the crashed run's losses exactly.
    losses = [train_step(model, opt, sched, step) for step in range(N + 1, N + M + 1)]
    assert losses == json.loads((ref / "losses.json").read_text())
