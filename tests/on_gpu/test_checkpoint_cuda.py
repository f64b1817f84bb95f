"""The checkpoint engine with the trainer's state on the GPU: pinned host buffers, asynchronous
device-to-host copies, and a restore that puts every tensor back on the GPU bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.version import VersionVector
from tests.integration.transfer.weights import same_bits


def cuda_state(seed: int) -> dict[str, Any]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    params = {
        "embed.weight": torch.randn(4096, 1024, device="cuda", generator=g).to(torch.bfloat16),
        "mlp.weight": torch.randn(4096, 4096, device="cuda", generator=g),
        # A strided view: copy_ must resolve it, not send its raw storage.
        "lm_head.weight": torch.randn(1024, 4096, device="cuda", generator=g).t(),
    }
    return {
        "model": params,
        "optimizer": {
            "state": {
                0: {
                    "step": torch.tensor(7.0),
                    "exp_avg": torch.randn(4096, 4096, device="cuda", generator=g),
                },
            },
            "param_groups": [{"lr": 1e-5, "params": [0]}],
        },
        "lr_scheduler": {"last_epoch": 7},
        "step": 7,
        "inference_weight_version": 3,
        "generation_config": {"temperature": 1.0},
    }


def test_cuda_state_round_trips_through_pinned_buffers(tmp_path: Path) -> None:
    engine = CheckpointEngine(tmp_path, pin_memory=True)
    assert engine.pin_memory
    state = cuda_state(1)
    handle = engine.save(state, version=VersionVector(7, 3))
    # The copy is over when save returns: the buffers it wrote are pinned, so the device-to-host
    # copies were queued asynchronously and synchronised once.
    assert engine._buffers and all(buf.is_pinned() for buf in engine._buffers.values())
    # The trainer may overwrite its GPU tensors at once: the checkpoint must hold the old values.
    expected = {k: v.clone() for k, v in state["model"].items()}
    for t in state["model"].values():
        t.zero_()
    handle.wait_finished(120)

    info = engine.latest()
    assert info is not None and info.version == VersionVector(7, 3)
    loaded = engine.load(info, map_location="cuda")
    for name, tensor in expected.items():
        got = loaded["model"][name]
        assert got.is_cuda, name
        assert same_bits(got, tensor), name
    moment = loaded["optimizer"]["state"][0]["exp_avg"]
    assert moment.is_cuda and same_bits(moment, cuda_state(1)["optimizer"]["state"][0]["exp_avg"])
    assert loaded["step"] == 7


def test_pinned_and_pageable_engines_write_the_same_bytes(tmp_path: Path) -> None:
    """The pinned path is an optimisation only: both engines commit identical files."""
    state = cuda_state(2)
    roots = {}
    for pinned in (True, False):
        root = tmp_path / ("pinned" if pinned else "pageable")
        engine = CheckpointEngine(root, pin_memory=pinned)
        engine.save(state, version=VersionVector(1, 1)).wait_finished(120)
        info = engine.latest()
        assert info is not None
        roots[pinned] = info.path
    for layer_file in sorted(p.name for p in roots[True].iterdir() if p.suffix == ".bin"):
        assert (roots[True] / layer_file).read_bytes() == (
            roots[False] / layer_file
        ).read_bytes(), layer_file
