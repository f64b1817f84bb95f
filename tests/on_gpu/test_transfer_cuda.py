"""Weight transfer from a trainer's GPU to a rollout's GPU, over TCP and over UCX.

The publisher stages CUDA weights in pinned host memory at ``publish`` (the trainer may update
its GPU copy right after); the receiver's live tensors go to the GPU with one copy each. Run on
the GPU machine's own UCX build (the ``ucxx-cu13`` wheels), where UCX loads its CUDA transports.
"""

from __future__ import annotations

import pytest
import torch

from recovery.transfer import (
    InMemoryRegistry,
    TensorSpec,
    WeightPublisher,
    WeightReceiver,
    make_transport,
)
from tests.integration.transfer.weights import same_bits

NAME = "policy"


def gpu_weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(version)
    return {
        "embed": torch.randn(32000, 1024, device="cuda", generator=g).to(torch.bfloat16),
        "mlp.up": torch.randn(4096, 1024, device="cuda", generator=g).to(torch.float16),
        "mlp.down": torch.randn(1024, 4096, device="cuda", generator=g).t(),  # strided view
        "positions": torch.arange(1 << 20, device="cuda", dtype=torch.int64) * version,
    }


@pytest.mark.parametrize("kind", ["tcp", "ucx"])
def test_gpu_weights_arrive_on_the_gpu_bit_exact(kind: str) -> None:
    transport = make_transport(kind)
    registry = InMemoryRegistry()
    specs = [TensorSpec.of(n, t.contiguous().cpu()) for n, t in gpu_weights(0).items()]
    publisher = WeightPublisher(NAME, transport=transport, registry=registry)
    receiver = WeightReceiver(NAME, specs, transport=transport, registry=registry, timeout=30)
    try:
        for version in (1, 2):
            trainer = gpu_weights(version)
            expected = {k: v.clone() for k, v in trainer.items()}
            publication = publisher.publish(version, trainer)
            for t in trainer.values():
                t.zero_()  # the trainer moves on: the published version must not change
            report = receiver.pull(version, timeout=120)
            publication.wait_committed(timeout=30)
            on_gpu = {k: v.to("cuda", non_blocking=False) for k, v in receiver.live_tensors.items()}
            assert receiver.live_version == version
            for name, tensor in expected.items():
                assert same_bits(on_gpu[name], tensor), f"{kind} v{version}: {name} differs"
            print(f"{kind} v{version}: {report}")
    finally:
        receiver.close()
        publisher.close()
