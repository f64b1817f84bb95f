"""Deterministic checkpoint content for the kill tests: the state for a step is a pure function
of the step, so a test can rebuild what a killed writer saved and compare bit for bit."""

from __future__ import annotations

from typing import Any

import torch

from recovery.checkpoint.version import VersionVector, WeightVersionTable


def make_state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(256, 256, generator=g), "b": torch.randn(256, generator=g)},
        "optimizer": {
            "state": {
                0: {
                    "step": torch.tensor(float(step)),
                    "exp_avg": torch.randn(256, 256, generator=g),
                }
            },
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}],
        },
        "lr_scheduler": {"last_epoch": step},
        "step": step,
        "inference_weight_version": step // 2,
        "generation_config": {"temperature": 0.7},
        "experience_buffer": torch.randn(64, 1024, generator=g),
    }


def version_of(step: int) -> VersionVector:
    return VersionVector(step, step // 2)


def table_of(step: int) -> WeightVersionTable:
    table = WeightVersionTable()
    for s in range(2, step + 1, 2):
        table.record(s, s // 2)
    return table
