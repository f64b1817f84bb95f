"""Deterministic weight sets shared by the tests and the peer processes they start."""

from __future__ import annotations

import torch

from recovery.transfer import TensorSpec

NAME = "policy"


def make_weights(seed: int, version: int) -> dict[str, torch.Tensor]:
    """A small weight set with every dtype the issue names; different for every version."""
    gen = torch.Generator().manual_seed(seed * 1000 + version)
    return {
        "embed.bf16": torch.randn(256, 96, generator=gen).to(torch.bfloat16),
        "attn.fp16": torch.randn(100, 37, generator=gen).to(torch.float16),
        # Transposed: non-contiguous on purpose; the publisher copies it to contiguous.
        "mlp.fp32": torch.randn(300, 64, generator=gen).t(),
        "positions.int64": torch.randint(
            -(2**62), 2**62, (3000,), generator=gen, dtype=torch.int64
        ),
    }


def specs(seed: int = 0) -> list[TensorSpec]:
    """The layout receivers preallocate."""
    return [TensorSpec.of(n, t.contiguous()) for n, t in make_weights(seed, 0).items()]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN-safe, dtype-strict)."""
    a, b = a.contiguous(), b.contiguous()
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )
