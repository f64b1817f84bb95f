"""Resharding: trainer tensor-parallel shards (N ranks) → the rollout layout (M ranks).

Each tensor is either replicated or split along one dimension (dim 0 for a column-parallel
linear's weight, dim 1 for a row-parallel one). A tensor's split dimension may differ between
the two layouts. Shards come out contiguous, ready to send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from recovery.transfer.errors import TransferConfigError


@dataclass(frozen=True)
class TensorParallelLayout:
    """``world_size`` ranks; ``split_dims[name]`` is the dimension ``name`` is split on, or None."""

    world_size: int
    split_dims: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise TransferConfigError(f"world_size must be an int >= 1, got {self.world_size!r}")
        for name, dim in self.split_dims.items():
            if dim is not None and not isinstance(dim, int):
                raise TransferConfigError(
                    f"split dim of {name!r} must be an int or None, got {dim!r}"
                )


def _dim(layout: TensorParallelLayout, name: str, ndim: int, side: str) -> int | None:
    if name not in layout.split_dims:
        raise TransferConfigError(f"{side} layout does not say how tensor {name!r} is split")
    dim = layout.split_dims[name]
    if dim is None:
        return None
    if not -ndim <= dim < ndim:
        raise TransferConfigError(
            f"{side} split dim {dim} of {name!r} is out of range for {ndim} dims"
        )
    return dim % ndim


def gather_full(
    state: Sequence[Mapping[str, torch.Tensor]], layout: TensorParallelLayout
) -> dict[str, torch.Tensor]:
    """Reassemble the unsharded tensors from every rank's shards in ``layout``."""
    if len(state) != layout.world_size:
        raise TransferConfigError(
            f"layout has {layout.world_size} ranks but {len(state)} shards were given"
        )
    names = list(state[0])
    for rank, shard in enumerate(state):
        if list(shard) != names and set(shard) != set(names):
            raise TransferConfigError(
                f"rank {rank} holds tensors {sorted(shard)}, rank 0 holds {sorted(names)}"
            )
    full: dict[str, torch.Tensor] = {}
    for name in names:
        parts = [shard[name] for shard in state]
        dim = _dim(layout, name, parts[0].dim(), "source")
        if dim is None:
            for rank, part in enumerate(parts[1:], start=1):
                if part.shape != parts[0].shape or not torch.equal(part, parts[0]):
                    raise TransferConfigError(
                        f"replicated tensor {name!r} differs between rank 0 and rank {rank}"
                    )
            full[name] = parts[0]
            continue
        for rank, part in enumerate(parts):
            if part.dtype != parts[0].dtype or [
                s for i, s in enumerate(part.shape) if i != dim
            ] != [s for i, s in enumerate(parts[0].shape) if i != dim]:
                raise TransferConfigError(
                    f"shard of {name!r} on rank {rank} has {part.dtype}{list(part.shape)}, "
                    f"incompatible with rank 0's {parts[0].dtype}{list(parts[0].shape)} along dim {dim}"
                )
        full[name] = torch.cat(parts, dim=dim)
    return full


def reshard(
    state: Sequence[Mapping[str, torch.Tensor]],
    src_layout: TensorParallelLayout,
    dst_layout: TensorParallelLayout,
    *,
    dst_ranks: Sequence[int] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """Turn shards in ``src_layout`` into shards in ``dst_layout`` (for ``dst_ranks``, default all).

    Raises TransferConfigError naming the tensor when a size does not divide by the destination
    world size or the shards are inconsistent.
    """
    ranks = list(range(dst_layout.world_size)) if dst_ranks is None else list(dst_ranks)
    for rank in ranks:
        if not isinstance(rank, int) or not 0 <= rank < dst_layout.world_size:
            raise TransferConfigError(
                f"destination rank {rank!r} is outside 0..{dst_layout.world_size - 1}"
            )
    full = gather_full(state, src_layout)
    out: list[dict[str, torch.Tensor]] = [{} for _ in ranks]
    for name, tensor in full.items():
        dim = _dim(dst_layout, name, tensor.dim(), "destination")
        if dim is not None and tensor.shape[dim] % dst_layout.world_size:
            raise TransferConfigError(
                f"tensor {name!r} has size {tensor.shape[dim]} on dim {dim}, "
                f"not divisible by {dst_layout.world_size} destination ranks"
            )
        for slot, rank in enumerate(ranks):
            if dim is None:
                out[slot][name] = tensor.clone(memory_format=torch.contiguous_format)
            else:
                size = tensor.shape[dim] // dst_layout.world_size
                out[slot][name] = tensor.narrow(dim, rank * size, size).contiguous()
    return out
