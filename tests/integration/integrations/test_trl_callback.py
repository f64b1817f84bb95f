"""RLGuardCallback inside the real GRPOTrainer (examples/trl_grpo/train.py, tiny size), without
a stack: the phases it reports, the faults it counts, and the launcher refusing a TRL version
the integration does not support."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from integrations.trl.callback import RLGuardCallback
from integrations.trl.checkpoints import newest_complete_checkpoint
from recovery.report import heartbeat_path, read_heartbeat

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trl_grpo" / "train.py"


def _env(run_dir: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join(
        [*extra.pop("PREPEND", "").split(os.pathsep), str(ROOT)]
    ).strip(os.pathsep)
    if run_dir is not None:
        env["RLGUARD_RUN_DIR"] = str(run_dir)
    return {**env, **extra}


def _train(out: Path, run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--size", "tiny", *args],
        cwd=ROOT, env=_env(run_dir), capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip


def _beat(run_dir: Path) -> dict[str, Any]:
    return read_heartbeat(heartbeat_path(run_dir, "trainer", 0)) or {}


class PhaseSpy(RLGuardCallback):
    """Records every phase the callback reports, in order (the file shows only the latest)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.phases: list[tuple[str, int | None]] = []

    def _set_phase(self, phase: str, *, force: bool = False) -> None:
        self.phases.append((phase, self._step_in_progress))
        super()._set_phase(phase, force=force)


# transformers 5.24 and TRL 1.16 warn about their own deprecations while training.
@pytest.mark.filterwarnings(
    "ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning"
)
def test_phases_tokens_signals_and_sealed_checkpoints(tmp_path: Path) -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    out, run_dir = tmp_path / "out", tmp_path / "run"
    args = example.parse_args(["--output_dir", str(out), "--max_steps", "4", "--save_steps", "2",
                               "--size", "tiny", "--rlguard", "off"])  # fmt: skip
    trainer = example.build_trainer(args)
    spy = PhaseSpy(run_dir)
    trainer.add_callback(spy)
    trainer.train()

    # Each step: TRAIN, ROLLOUT while TRL generates (inside the step), back to TRAIN.
    for step in range(1, 5):
        during = [phase for phase, in_step in spy.phases if in_step == step]
        assert during[:3] == ["TRAIN", "ROLLOUT", "TRAIN"], (step, spy.phases)
    assert [p for p, _ in spy.phases].count("SAVE") == 2 and spy.phases[-1][0] == "DONE"
    beat = _beat(run_dir)
    assert beat["phase"] == "DONE" and beat["step"] == 4 and beat["tokens_generated"] > 0
    assert (beat["checkpoint_step"], beat["checkpoint_inference_version"]) == (4, 4)
    assert set(beat["signals"]) == {"grpo_reward_mean", "grpo_reward_std", "grpo_kl",
                                    "grpo_completion_length_mean", "grpo_completion_clipped_ratio"}  # fmt: skip
    newest = newest_complete_checkpoint(out)
    assert newest is not None and newest.global_step == 4
    assert "generate" not in vars(trainer.model)  # the wrapper is gone after training


def _example_trainer(out: Path, *extra: str) -> Any:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train as example
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    args = example.parse_args(["--output_dir", str(out), "--save_steps", "100", "--size", "tiny",
                               "--rlguard", "off", *extra])  # fmt: skip
    return example.build_trainer(args)


@pytest.mark.filterwarnings(
    "ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning"
)
def test_completions_that_come_back_empty_are_counted_as_failed_samples(tmp_path: Path) -> None:
    """A policy collapsed into empty answers (every token but the end of sequence suppressed):
    each step trains on nothing and reports success; the heartbeat counts every completion and
    every one as failed (rollout_failed_samples_total, the rollout_samples_failing signal). The
    same job generating normally counts its completions and not all of them as failed."""
    counts = {}
    for name, collapsed in (("healthy", False), ("collapsed", True)):
        trainer = _example_trainer(tmp_path / f"{name}-out", "--max_steps", "2")
        if collapsed:
            eos = trainer.generation_config.eos_token_id
            ends = set(eos if isinstance(eos, list) else [eos])
            others = [i for i in range(trainer.model.config.vocab_size) if i not in ends]
            # TRL's two generation paths read one or the other; without the example's floor
            # on the completion length (its model "soon learns to stop at once" otherwise).
            trainer.generation_config.suppress_tokens = others
            trainer.generation_config.min_new_tokens = None
            trainer.generation_kwargs["suppress_tokens"] = others
            trainer.generation_kwargs.pop("min_new_tokens", None)
        run_dir = tmp_path / f"{name}-run"
        trainer.add_callback(RLGuardCallback(run_dir))
        trainer.train()
        beat = _beat(run_dir)
        counts[name] = (beat["rollout_samples_total"], beat["rollout_failed_samples_total"])
    (total, failed), (c_total, c_failed) = counts["healthy"], counts["collapsed"]
    assert total > 0 and (failed or 0) < total, counts
    assert c_total == total and c_failed == c_total, counts  # the same completions, all empty


def test_a_step_that_raises_is_counted_with_its_step_also_after_a_restart(tmp_path: Path) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    first = _train(out, run_dir, "--max_steps", "5", "--save_steps", "2", "--fail_at_step", "3")
    assert first.returncode == 1 and "injected failure in training step 3" in first.stderr
    beat = _beat(run_dir)
    assert (beat["train_step_failures_total"], beat["train_last_failed_step"]) == (1, 3)
    assert beat["checkpoint_write_errors_total"] == 0
    # The restarted process fails at the same step again: the count goes on (the policy's
    # "the same step failed again" escalation needs both).
    again = _train(out, run_dir, "--max_steps", "5", "--save_steps", "2", "--fail_at_step", "3",
                   "--resume_from_checkpoint", str(out / "checkpoint-2"))  # fmt: skip
    assert again.returncode == 1
    beat = _beat(run_dir)
    assert (beat["train_step_failures_total"], beat["train_last_failed_step"]) == (2, 3)


def test_a_checkpoint_the_storage_refuses_is_a_checkpoint_error_not_a_step_failure(
    tmp_path: Path,
) -> None:
    out, run_dir = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    (out / "checkpoint-2").write_text("a file where the Trainer wants its directory")
    result = _train(out, run_dir, "--max_steps", "3", "--save_steps", "2")
    assert result.returncode == 1
    beat = _beat(run_dir)
    assert beat["checkpoint_write_errors_total"] == 1 and beat["train_step_failures_total"] == 0


def _shadow_trl(tmp_path: Path, version: str) -> Path:
    """A site directory whose ``trl`` distribution metadata says ``version``; first on
    PYTHONPATH, it is what ``importlib.metadata`` finds (as after ``pip install trl==...``)."""
    site = tmp_path / "site"
    info = site / f"trl-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: trl\nVersion: {version}\n")
    return site


def test_launch_refuses_an_unsupported_trl_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    site = _shadow_trl(tmp_path, "0.29.1")
    run_dir, out = tmp_path / "run", tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "integrations.launch", "--job", "grpo", "--role", "trainer",
         "--run-dir", str(run_dir), "--integration", "trl", "--",
         sys.executable, str(EXAMPLE), "--output_dir", str(out), "--size", "tiny"],
        cwd=ROOT, env=_env(None, PREPEND=str(site)), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "trl 0.29.1 is not supported" in lines[0] and "trl>=1.16.0,<1.17" in lines[0]
    assert not run_dir.exists() and not out.exists()  # nothing started, nothing written
