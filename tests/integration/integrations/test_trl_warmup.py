"""The warm standby's warm-up (:mod:`integrations.trl.warmup`) leaves a TRL run bit-identical.

The same tiny GRPO job (examples/trl_grpo/train.py, 3 steps, RLGuard off) runs twice: once as
``python train.py``, once through the real standby process (``python -m
recovery.supervision.standby_process --warmup integrations.trl.warmup:warm_up``, the order on
its stdin, as the launcher gives it). The final parameters are equal bit for bit and the
logged losses the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from recovery.supervision.standby import Order
from tests.integration.integrations._trl import EXAMPLE, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]


def _argv(out: Path) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--size", "tiny",
            "--max_steps", "3", "--save_steps", "3", "--rlguard", "off"]  # fmt: skip


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _result(out: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    ckpt = out / "checkpoint-3"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    losses = [e["loss"] for e in state["log_history"] if "loss" in e]
    return load_file(str(ckpt / "model.safetensors")), losses


def test_warm_up_in_the_standby_leaves_the_run_bit_identical(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    subprocess.run(_argv(plain), cwd=ROOT, env=_env(), check=True, timeout=300,
                   capture_output=True)  # fmt: skip
    warm = tmp_path / "warm"
    log = tmp_path / "standby-run.log"
    order = Order(_argv(warm), str(log), env=_env(), cwd=str(ROOT))
    standby = subprocess.run(
        [sys.executable, "-m", "recovery.supervision.standby_process", "--role", "trainer",
         "--warmup", "integrations.trl.warmup:warm_up"],
        cwd=ROOT, env=_env(), input=order.to_line(), timeout=300, capture_output=True,
    )  # fmt: skip
    assert standby.returncode == 0, log.read_text() if log.exists() else standby.stderr
    assert b"warm-up" not in standby.stderr, standby.stderr  # it ran, it did not fail
    want, want_losses = _result(plain)
    got, got_losses = _result(warm)
    assert len(want_losses) == 3 and got_losses == want_losses
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_failing_warm_up_is_skipped_and_said(capsys: pytest.CaptureFixture[str]) -> None:
    from recovery.supervision.standby_process import run_warmup

    run_warmup("integrations.trl.warmup:no_such_function")
    assert "standby warm-up integrations.trl.warmup:no_such_function failed, skipped" in (
        capsys.readouterr().err
    )


def test_warm_up_leaves_every_rng_and_torch_setting_as_it_was() -> None:
    # The example reseeds everything itself (so the run above would not see a leaked RNG
    # draw); a script that does not must not either.
    import random

    import numpy as np

    from integrations.trl.warmup import warm_up

    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    numpy_state: Any = np.random.get_state()
    before = (random.getstate(), numpy_state[1].copy(), torch.random.get_rng_state())
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    warm_up()
    assert random.getstate() == before[0]
    numpy_after: Any = np.random.get_state()
    assert (numpy_after[1] == before[1]).all()
    assert torch.equal(torch.random.get_rng_state(), before[2])
    assert (torch.get_num_threads(), torch.get_default_dtype()) == (threads, dtype)
