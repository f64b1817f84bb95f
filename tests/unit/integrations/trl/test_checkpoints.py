"""Completion markers on TRL checkpoints and the resume argument the launcher derives from them.

The checkpoint directories are written by the real Trainer (a two-step tiny GRPO run of the
example, once per module); the tests then tear them the ways a kill during a save does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from integrations import IntegrationError
from integrations.trl import INTEGRATION, TRLIntegration, _check_range, check_versions
from integrations.trl.checkpoints import (
    MARKER_NAME,
    newest_complete_checkpoint,
    seal_checkpoint,
    verify_checkpoint,
)
from recovery.checkpoint.errors import CheckpointCorrupt

REPO = Path(__file__).resolve().parents[4]
EXAMPLE = REPO / "examples" / "trl_grpo" / "train.py"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An output dir with checkpoint-1 and checkpoint-2 written by the real GRPOTrainer (no
    callback: the tests seal them themselves)."""
    out = tmp_path_factory.mktemp("trl-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    subprocess.run(
        [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--max_steps", "2",
         "--save_steps", "1", "--size", "tiny", "--rlguard", "off"],
        check=True, cwd=REPO, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    return out


@pytest.fixture
def output_dir(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(trained, copy)
    for step in (1, 2):
        seal_checkpoint(
            copy / f"checkpoint-{step}", global_step=step, inference_version=step,
            framework={"trl": "test"},
        )  # fmt: skip
    return copy


def test_sealed_checkpoint_verifies_with_its_version(output_dir: Path) -> None:
    info = verify_checkpoint(output_dir / "checkpoint-2")
    assert (info.global_step, info.inference_version) == (2, 2)
    newest = newest_complete_checkpoint(output_dir)
    assert newest is not None and newest.path == output_dir / "checkpoint-2"


@pytest.mark.parametrize("damage", ["no_marker", "missing_optimizer", "truncated_weights"])
def test_torn_newest_checkpoint_is_passed_over(output_dir: Path, damage: str) -> None:
    torn = output_dir / "checkpoint-2"
    if damage == "no_marker":
        (torn / MARKER_NAME).unlink()  # killed before the marker: files may be half written
    elif damage == "missing_optimizer":
        (torn / "optimizer.pt").unlink()  # the Trainer would resume silently with a fresh one
    else:
        weights = torn / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointCorrupt):
        verify_checkpoint(torn)
    newest = newest_complete_checkpoint(output_dir)
    assert newest is not None and newest.path == output_dir / "checkpoint-1"


def test_marker_for_another_step_is_refused(output_dir: Path) -> None:
    shutil.copy(
        output_dir / "checkpoint-1" / MARKER_NAME, output_dir / "checkpoint-2" / MARKER_NAME
    )
    with pytest.raises(CheckpointCorrupt, match="checksum mismatch|not 2|bytes"):
        verify_checkpoint(output_dir / "checkpoint-2")


def test_resume_argv_points_at_newest_complete_and_replaces_a_given_one(output_dir: Path) -> None:
    (output_dir / "checkpoint-2" / MARKER_NAME).unlink()
    argv = ["python", "train.py", "--output_dir", str(output_dir),
            "--resume_from_checkpoint", str(output_dir / "checkpoint-2"), "--max_steps", "9"]  # fmt: skip
    assert INTEGRATION.resume_argv(argv) == [
        "python", "train.py", "--output_dir", str(output_dir), "--max_steps", "9",
        "--resume_from_checkpoint", str(output_dir / "checkpoint-1"),
    ]  # fmt: skip
    equals_form = ["train.py", f"--output_dir={output_dir}", "--resume_from_checkpoint=x"]
    assert INTEGRATION.resume_argv(equals_form)[-2:] == [
        "--resume_from_checkpoint",
        str(output_dir / "checkpoint-1"),
    ]


def test_resume_argv_unchanged_without_a_complete_checkpoint(tmp_path: Path) -> None:
    argv = ["train.py", "--output_dir", str(tmp_path / "none-yet")]
    assert TRLIntegration().resume_argv(argv) == argv
    assert TRLIntegration().resume_argv(["train.py"]) == ["train.py"]


def test_installed_versions_are_supported() -> None:
    # the pins of the trl extra in pyproject.toml, which the dev install holds
    assert check_versions() == {"trl": "1.16.0", "transformers": "5.19.0"}
    INTEGRATION.check_environment()


@pytest.mark.parametrize(
    ("installed", "ok"),
    [("1.16.0", True), ("1.16.3", True), ("1.15.9", False), ("1.17.0", False), ("0.29.1", False),
     ("2.0.0", False), ("1.16.0rc1", True), ("garbage", False)],
)  # fmt: skip
def test_version_range(installed: str, ok: bool) -> None:
    if ok:
        _check_range("trl", installed, ("1.16.0", "1.17"))
    else:
        with pytest.raises(IntegrationError, match="trl"):
            _check_range("trl", installed, ("1.16.0", "1.17"))
