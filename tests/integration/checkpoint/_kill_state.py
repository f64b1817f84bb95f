"""Deterministic checkpoint content for the kill tests: the state saved at a step is a pure
function of the step, so a test can rebuild what a killed writer saved and compare bit for bit.
The tensors depend only on the writer (``step // STEPS_PER_WRITER``), so a writer builds them
once and spends its life writing, which is where the kills should land."""

from __future__ import annotations

import functools
from typing import Any

import torch

from recovery.checkpoint.version import VersionVector, WeightVersionTable

STEPS_PER_WRITER = 1000


@functools.lru_cache(maxsize=4)
def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(256, 256, generator=g),
        "b": torch.randn(256, generator=g),
        "exp_avg": torch.randn(256, 256, generator=g),
        "buffer": torch.randn(64, 1024, generator=g),
    }


def make_state(step: int, tensors: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    t = tensors if tensors is not None else _tensors(step // STEPS_PER_WRITER)
    return {
        "model": {"w": t["w"], "b": t["b"]},
        "optimizer": {
            "state": {0: {"step": torch.tensor(float(step)), "exp_avg": t["exp_avg"]}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}],
        },
        "lr_scheduler": {"last_epoch": step},
        "step": step,
        "inference_weight_version": step // 2,
        "generation_config": {"temperature": 0.7},
        "experience_buffer": t["buffer"],
    }


def writer_tensors(first_step: int) -> dict[str, torch.Tensor]:
    return _tensors(first_step // STEPS_PER_WRITER)


def version_of(step: int) -> VersionVector:
    return VersionVector(step, step // 2)


def table_of(step: int) -> WeightVersionTable:
    table = WeightVersionTable()
    for s in range(max(2, step - 20) // 2 * 2, step + 1, 2):
        if s:
            table.record(s, s // 2)
    return table
