from __future__ import annotations

from typing import Any

import torch


def small_training_state(seed: int = 0, steps: int = 3) -> dict[str, Any]:
    """A real model + AdamW + scheduler after a few steps, as checkpoint components."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "lr_scheduler": sched.state_dict(),
        "step": steps,
        "inference_weight_version": steps // 2,
        "generation_config": {"temperature": 0.7, "top_p": 0.95, "max_new_tokens": 64},
    }


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Deep equality where tensors must match bit for bit (dtype, shape and bytes)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert _bytes_of(a) == _bytes_of(b), path
        return
    if isinstance(a, dict):
        assert isinstance(b, dict), path
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
        assert a == b, path


def _bytes_of(t: torch.Tensor) -> bytes:
    flat = t.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""
