from __future__ import annotations

import pytest
import torch

from recovery.transfer.errors import TransferConfigError
from recovery.transfer.reshard import TensorParallelLayout, gather_full, reshard

SPLITS_SRC = {"qkv": 0, "proj": 1, "norm": None, "bias": 0}


def full_model() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "qkv": torch.randn(24, 16, generator=gen).to(torch.bfloat16),  # column-parallel: dim 0
        "proj": torch.randn(16, 24, generator=gen),  # row-parallel: dim 1
        "norm": torch.randn(16, generator=gen).to(torch.float16),  # replicated
        "bias": torch.arange(24, dtype=torch.int64),
    }


def shard(
    full: dict[str, torch.Tensor], layout: TensorParallelLayout
) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.world_size)]
    for name, tensor in full.items():
        dim = layout.split_dims[name]
        parts = (
            [tensor] * layout.world_size
            if dim is None
            else list(tensor.chunk(layout.world_size, dim))
        )
        for rank, part in enumerate(parts):
            out[rank][name] = part.clone()
    return out


@pytest.mark.parametrize(("n", "m"), [(1, 4), (2, 3), (4, 2), (8, 1), (3, 6), (6, 4), (2, 2)])
def test_reshard_matches_slicing_the_unsharded_tensor(n: int, m: int) -> None:
    full = full_model()
    src = TensorParallelLayout(n, SPLITS_SRC)
    dst = TensorParallelLayout(m, SPLITS_SRC)
    result = reshard(shard(full, src), src, dst)
    assert len(result) == m
    for rank, tensors in enumerate(result):
        for name, tensor in tensors.items():
            dim = SPLITS_SRC[name]
            expected = full[name] if dim is None else full[name].chunk(m, dim)[rank]
            assert tensor.dtype == full[name].dtype
            assert torch.equal(tensor, expected), (n, m, rank, name)
            assert tensor.is_contiguous()


def test_split_dimension_may_change_between_layouts() -> None:
    full = full_model()
    src = TensorParallelLayout(2, SPLITS_SRC)
    dst = TensorParallelLayout(4, {"qkv": 1, "proj": 0, "norm": None, "bias": None})
    result = reshard(shard(full, src), src, dst)
    for rank in range(4):
        assert torch.equal(result[rank]["qkv"], full["qkv"].chunk(4, 1)[rank])
        assert torch.equal(result[rank]["proj"], full["proj"].chunk(4, 0)[rank])
        assert torch.equal(result[rank]["bias"], full["bias"])


def test_selected_destination_ranks_only() -> None:
    full = full_model()
    src = TensorParallelLayout(2, SPLITS_SRC)
    dst = TensorParallelLayout(4, SPLITS_SRC)
    (only,) = reshard(shard(full, src), src, dst, dst_ranks=[3])
    assert torch.equal(only["qkv"], full["qkv"].chunk(4, 0)[3])


def test_gather_full_roundtrip() -> None:
    full = full_model()
    src = TensorParallelLayout(3, SPLITS_SRC)
    back = gather_full(shard(full, src), src)
    assert all(torch.equal(back[k], full[k]) for k in full)


def test_indivisible_size_is_refused_naming_the_tensor() -> None:
    full = full_model()
    src = TensorParallelLayout(2, SPLITS_SRC)
    with pytest.raises(TransferConfigError, match="'qkv' has size 24 on dim 0, not divisible by 5"):
        reshard(shard(full, src), src, TensorParallelLayout(5, SPLITS_SRC))


def test_inconsistent_inputs_are_refused() -> None:
    full = full_model()
    src = TensorParallelLayout(2, SPLITS_SRC)
    shards = shard(full, src)
    with pytest.raises(TransferConfigError, match="3 ranks but 2 shards"):
        reshard(shards, TensorParallelLayout(3, SPLITS_SRC), src)
    shards[1]["norm"] = shards[1]["norm"] + 1
    with pytest.raises(TransferConfigError, match="replicated tensor 'norm' differs"):
        reshard(shards, src, src)
    shards = shard(full, src)
    shards[1]["proj"] = torch.randn(15, 12)
    with pytest.raises(TransferConfigError, match="shard of 'proj' on rank 1"):
        reshard(shards, src, src)
    with pytest.raises(TransferConfigError, match="does not say how tensor 'bias'"):
        reshard(shard(full, src), src, TensorParallelLayout(2, {"qkv": 0, "proj": 1, "norm": None}))
    with pytest.raises(TransferConfigError, match="split dim 2 of 'norm' is out of range"):
        reshard(shard(full, src), src, TensorParallelLayout(2, {**SPLITS_SRC, "norm": 2}))
    with pytest.raises(TransferConfigError, match="destination rank 4"):
        reshard(shard(full, src), src, src, dst_ranks=[4])
    with pytest.raises(TransferConfigError, match="world_size"):
        TensorParallelLayout(0, SPLITS_SRC)
