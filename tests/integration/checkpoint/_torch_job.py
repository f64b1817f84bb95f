"""A tiny but real training job for the restore test (model, AdamW, LR schedule, data by step).

Run as ``python -m tests.integration.checkpoint._torch_job ROOT REF N M``: trains N steps,
checkpoints (core + aux + transient) with the CheckpointEngine, writes a reference copy of the
exact state with torch.save, trains M more steps recording each loss, then kills itself with
SIGKILL (a crash: no cleanup, no atexit)."""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.version import VersionVector, WeightVersionTable

PUSH_EVERY = 3


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    return model, opt, sched


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, step: int) -> float:
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return float(loss.item())


def main() -> None:
    torch.set_num_threads(1)
    root, ref, n, m = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    model, opt, sched = build()
    table = WeightVersionTable()
    for step in range(1, n + 1):
        train_step(model, opt, sched, step)
        if step % PUSH_EVERY == 0:
            table.record(step, step // PUSH_EVERY)
    version = VersionVector(n, table.version_at_step(n) or 0)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "lr_scheduler": sched.state_dict(),
        "step": n,
        "inference_weight_version": version.inference_version,
        "generation_config": {"temperature": 0.8, "top_p": 0.9},
        "experience_buffer": {"tokens": torch.arange(64).reshape(8, 8), "policy_version": [1] * 8},
        "kv_cache": torch.zeros(16),
        "dataloader_position": n * 8,
    }
    engine = CheckpointEngine(root)
    engine.save(state, version=version, weight_versions=table).wait(60)
    torch.save(copy.deepcopy({k: v for k, v in state.items() if k != "kv_cache"}), ref / "ref.pt")
    losses = [train_step(model, opt, sched, step) for step in range(n + 1, n + m + 1)]
    (ref / "losses.json").write_text(json.dumps(losses))
    print(f"trained to {n + m}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
