"""Split a state tree into a JSON skeleton and a flat list of tensors, and join them again.

``torch.save`` pickles, which is slow for large trees, cannot be checked before anything is
written, and executes code on load. Here a state component (a model ``state_dict``, an optimizer
``state_dict``, plain config values) becomes a tagged JSON skeleton in which every tensor is
replaced by its index; the tensor bytes go to one flat file per layer. Only plain values survive
the round trip: dicts (any scalar or tuple keys), lists, tuples, str, int, float (NaN and ±inf
included), bool, None, bytes, ``torch.dtype`` and dense tensors. Anything else is refused before
a byte is written, with the path of the offending value in the message.
"""

from __future__ import annotations

import base64
import ctypes
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError

_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
ALIGN = 64  # every tensor starts on a 64-byte boundary so a uint8 buffer can be viewed as any dtype

_DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64,
        torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
        torch.bool, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn,
        torch.float8_e5m2,
    )
}  # fmt: skip


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives inside its layer file."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    def as_json(self) -> list[Any]:
        """Compact manifest form."""
        return [self.dtype, list(self.shape), self.offset, self.nbytes]

    @classmethod
    def from_json(cls, data: Any) -> TensorSlot:
        """Parse a manifest entry; raises :class:`CheckpointCorrupt` if it is malformed."""
        try:
            dtype, shape, offset, nbytes = data
            return cls(str(dtype), tuple(int(s) for s in shape), int(offset), int(nbytes))
        except (TypeError, ValueError) as exc:
            raise CheckpointCorrupt(f"malformed tensor entry {data!r}: {exc}") from None


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (as written by :func:`flatten`)."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointCorrupt(f"unknown dtype {name!r} in checkpoint manifest") from None


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Flattener:
    """Collects the tensors of one layer and hands out their slots in one flat byte layout."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.slots: list[TensorSlot] = []
        self.size = 0

    def _add_tensor(self, t: torch.Tensor, path: str) -> int:
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            raise CheckpointInputError(
                f"{path}: only dense tensors can be checkpointed, got layout {t.layout} "
                f"on {t.device}"
            )
        name = str(t.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            raise CheckpointInputError(f"{path}: unsupported tensor dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        slot = TensorSlot(name, tuple(t.shape), self.size, nbytes)
        self.size = _aligned(self.size + nbytes)
        self.tensors.append(t)
        self.slots.append(slot)
        return len(self.slots) - 1

    def encode(self, value: Any, path: str) -> Any:
        """The JSON skeleton of ``value``; tensors are recorded and replaced by their index."""
        if value is None or isinstance(value, bool | str):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"__f": repr(value)}
        if isinstance(value, torch.Tensor):
            return {"__tensor": self._add_tensor(value, path)}
        if isinstance(value, torch.dtype):
            return {"__dtype": str(value).removeprefix("torch.")}
        if isinstance(value, bytes):
            return {"__b": base64.b64encode(value).decode()}
        if isinstance(value, list):
            return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"__t": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            keys = list(value)
            if all(isinstance(k, str) and not k.startswith("__") for k in keys):
                return {k: self.encode(value[k], f"{path}.{k}") for k in keys}
            pairs = []
            for k in keys:
                if not (k is None or isinstance(k, bool | int | float | str | tuple)):
                    raise CheckpointInputError(f"{path}: unsupported dict key {k!r}")
                pairs.append(
                    [self.encode(k, f"{path}<key>"), self.encode(value[k], f"{path}[{k!r}]")]
                )
            return {"__d": pairs}
        raise CheckpointInputError(
            f"{path}: cannot checkpoint a value of type {type(value).__name__} ({value!r:.80})"
        )


def decode(skeleton: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """Rebuild the value :meth:`Flattener.encode` turned into ``skeleton``."""
    if skeleton is None or isinstance(skeleton, bool | str | int | float):
        return skeleton
    if isinstance(skeleton, list):
        return [decode(v, tensors) for v in skeleton]
    if not isinstance(skeleton, dict):
        raise CheckpointCorrupt(f"unexpected skeleton node {skeleton!r:.80}")
    if len(skeleton) == 1:
        ((tag, inner),) = skeleton.items()
        if tag == "__tensor":
            return tensors[inner]
        if tag == "__f":
            return float(inner)
        if tag == "__dtype":
            return dtype_from_name(inner)
        if tag == "__b":
            return base64.b64decode(inner)
        if tag == "__t":
            return tuple(decode(v, tensors) for v in inner)
        if tag == "__d":
            return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in inner}
    return {k: decode(v, tensors) for k, v in skeleton.items()}


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        raise CheckpointCorrupt(f"list used as a dict key: {key!r}")
    return key


def copy_into(
    buffer: torch.Tensor, tensors: Sequence[torch.Tensor], slots: Sequence[TensorSlot]
) -> None:
    """Copy every tensor into its slot of the flat uint8 ``buffer`` (the blocking part of save)."""
    # Dense host tensors are copied with one plain memmove each: torch's copy_ splits large
    # copies over its intra-op threads, which on a machine whose cores are busy (the trainer's
    # own data loaders, other jobs) measured 2-3x slower than a single memmove. Everything else
    # (device tensors, strided views, lazily conjugated/negated views, tensor subclasses) goes
    # through copy_, which resolves them. Device-to-host copies into a pinned buffer are queued
    # asynchronously; the caller synchronizes once after the last one.
    pinned = buffer.is_pinned()
    base = buffer.data_ptr()
    with torch.no_grad():
        for t, slot in zip(tensors, slots, strict=True):
            if slot.nbytes == 0:
                continue
            if (
                type(t) in _PLAIN_TENSOR_TYPES
                and t.device.type == "cpu"
                and t.is_contiguous()
                and not t.is_conj()
                and not t.is_neg()
            ):
                ctypes.memmove(base + slot.offset, t.data_ptr(), slot.nbytes)
                continue
            dst = buffer[slot.offset : slot.offset + slot.nbytes].view(t.dtype).view(t.shape)
            dst.copy_(t, non_blocking=pinned and t.device.type == "cuda")


def views_of(buffer: torch.Tensor, slots: Sequence[TensorSlot]) -> list[torch.Tensor]:
    """Tensors that view their slots of ``buffer`` (no copy)."""
    out = []
    for slot in slots:
        if slot.offset + slot.nbytes > buffer.numel():
            raise CheckpointCorrupt(
                f"tensor slot {slot} lies beyond the {buffer.numel()}-byte file"
            )
        dtype = dtype_from_name(slot.dtype)
        raw = buffer[slot.offset : slot.offset + slot.nbytes]
        out.append(raw.view(dtype).view(slot.shape))
    return out
