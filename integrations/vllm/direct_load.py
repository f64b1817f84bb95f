"""Load a refit's weights straight into a vLLM model's live parameters.

vLLM's in-place reload (``reload_weights``) rebuilds every layer through the model's
``load_weights``, which for a small model costs far more than the bytes. A refit knows which
names it moves, so :func:`plan_direct_load` makes a plan from them, against the model as it is:

- a checkpoint tensor whose module vLLM fuses (the model's ``packed_modules_mapping``, e.g.
  ``q_proj``/``k_proj``/``v_proj`` -> ``qkv_proj``) is a row block of the fused parameter;
- a live parameter (norms, biases, embeddings; every weight on GPU) is copied into in place;
- a CPU linear layer whose weight vLLM packed and dropped gets a new weight tensor and is
  processed again by its ``quant_method.process_weights_after_loading``; on CPU every embedding
  module whose weight was loaded is processed again too, a tied output head included.

Anything the plan does not recognise (tensor parallelism, quantization, a name that maps to no
parameter, a shape that does not fit, a parameter left uncovered) makes it return None with the
reason, and the caller uses vLLM's in-place reload: never a partial load. The measurements:
``docs/performance.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recovery.transfer import TensorSpec
from recovery.transfer.manifest import byte_view

# The most memory the rebuilt layers' weights are kept in between refits (see _Target.buffer).
KEEP_BUFFER_BYTES = 1 << 30


@dataclass
class _Target:
    """One model parameter and the checkpoint tensors that make it, as row blocks in order."""

    param_name: str
    module: torch.nn.Module
    leaf: str
    sources: list[tuple[int, str]] = field(default_factory=list)  # (shard index, checkpoint name)
    repack: bool = False  # a packed CPU linear: rebuilt and processed again
    #: The tensor the last refit rebuilt the packed layer's weight in, filled again by the next
    #: one: a fresh one each time cost its first-touch page faults (about half of the copies'
    #: time). Never the receiver's memory; whatever the kernel kept of it, the new weight is
    #: packed again right after it is written. Kept up to KEEP_BUFFER_BYTES in all (each is
    #: memory the engine holds between refits).
    buffer: torch.Tensor | None = None


@dataclass
class DirectLoad:
    """A plan for one weight layout; :meth:`load` carries it out."""

    targets: list[_Target]
    #: Embeddings (and output heads tied to them: modules of their own that share the weight)
    #: processed again after the copy: on CPU each keeps a packed copy of its weight.
    reprocess: list[torch.nn.Module] = field(default_factory=list)
    #: Each target parameter's shape when the plan was made (packed and dropped: empty).
    shapes: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.shapes:
            self.shapes = self._current_shapes()

    def _current_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(getattr(t.module, t.leaf).shape) for t in self.targets]

    def still_fits(self) -> bool:
        """The model's parameters are still as planned for (a kept plan is checked with this
        before it is used again: what it decided, to copy in place or to rebuild and pack,
        depends on them)."""
        return self._current_shapes() == self.shapes

    def load(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Put ``tensors`` (the layout the plan was made for) into the model; seconds spent
        copying into parameters and processing (packing) layers again."""
        # On one thread: the copies and the CPU kernels' packing are many small steps, each a
        # parallel region that waits for its slowest thread, and on a shared host (an engine's
        # cores are its generation's too, or other jobs') a descheduled thread stalled each one:
        # packing a 10 MiB model took 80-354 ms on two threads, 10-40 ms on one (load average
        # 5-7 on 2 vCPUs). The worker's own setting is put back at once (a refit runs between
        # the engine's steps, never beside one).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._load(tensors)
        finally:
            torch.set_num_threads(threads)

    def _load(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, float]:
        copy_s = process_s = 0.0
        kept = 0
        with torch.no_grad():
            for target in self.targets:
                started = time.perf_counter()
                parts = [tensors[name] for _, name in target.sources]
                if target.repack:
                    # A fresh tensor the layer owns, the parts copied in as its row blocks.
                    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
                    weight = target.buffer
                    if (
                        weight is None
                        or tuple(weight.shape) != shape
                        or weight.dtype != parts[0].dtype
                    ):
                        weight = torch.empty(shape, dtype=parts[0].dtype)
                    size = weight.numel() * weight.element_size()
                    target.buffer = weight if kept + size <= KEEP_BUFFER_BYTES else None
                    kept += size if target.buffer is not None else 0
                    _copy_rows(weight, parts)
                    setattr(
                        target.module, target.leaf, torch.nn.Parameter(weight, requires_grad=False)
                    )
                    copied = time.perf_counter()
                    target.module.quant_method.process_weights_after_loading(target.module)  # type: ignore[union-attr,operator]
                    copy_s += copied - started
                    process_s += time.perf_counter() - copied
                    continue
                _copy_rows(getattr(target.module, target.leaf).data, parts)
                copy_s += time.perf_counter() - started
            started = time.perf_counter()
            for module in self.reprocess:
                module.quant_method.process_weights_after_loading(module)  # type: ignore[union-attr,operator]
            process_s += time.perf_counter() - started
        return {"copy_s": copy_s, "process_s": process_s}


def _copy_rows(dest: torch.Tensor, parts: Sequence[torch.Tensor]) -> None:
    """Copy ``parts`` into ``dest``'s first rows, one after the other.

    A plain single-threaded memcpy where it can be (CPU, same dtype, contiguous): torch's
    ``copy_`` splits a copy over its intra-op threads and waits for the slowest, and on a busy
    host (an engine's CPU cores are shared with its own generation, or with other jobs) a
    descheduled thread made the copies of a 10 MiB refit take 5 to 200 ms."""
    row = 0
    for part in parts:
        block = dest.narrow(0, row, part.shape[0])
        row += part.shape[0]
        if (
            block.device.type == part.device.type == "cpu"
            and block.dtype == part.dtype
            and block.is_contiguous()
            and part.is_contiguous()
            and part.numel()
        ):
            np.copyto(
                np.frombuffer(byte_view(block), dtype=np.uint8),
                np.frombuffer(byte_view(part), dtype=np.uint8),
            )
        else:
            block.copy_(part)


def plan_direct_load(
    model: torch.nn.Module, specs: Sequence[TensorSpec], *, tensor_parallel: int, platform_cpu: bool
) -> tuple[DirectLoad | None, str]:
    """A plan to load ``specs`` into ``model``, or None and why vLLM's reload must be used."""
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    if tensor_parallel != 1:
        return None, f"tensor parallel size {tensor_parallel} (shards are not planned)"
    params = dict(model.named_parameters())
    packed: dict[str, list[str]] = dict(getattr(model, "packed_modules_mapping", {}) or {})
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    by_spec = {s.name: s for s in specs}
    targets: dict[str, _Target] = {}
    for spec in specs:
        if tied and spec.name == "lm_head.weight":
            continue  # the head is the embedding (vLLM's own load_weights skips it too)
        parts = spec.name.split(".")
        index, fused_parts = 0, parts
        for i, part in enumerate(parts):
            for fused, shards in packed.items():
                if part in shards:
                    index, fused_parts = shards.index(part), [*parts[:i], fused, *parts[i + 1 :]]
        param_name = ".".join(fused_parts)
        if param_name not in params:
            return None, f"{spec.name} maps to no parameter of the model ({param_name})"
        module_name, _, leaf = param_name.rpartition(".")
        target = targets.setdefault(
            param_name, _Target(param_name, model.get_submodule(module_name), leaf)
        )
        target.sources.append((index, spec.name))
    uncovered = sorted(set(params) - set(targets))
    if uncovered:
        return None, f"parameters no checkpoint tensor fills: {uncovered[:5]}"
    for target in targets.values():
        target.sources.sort()
        if [i for i, _ in target.sources] != list(range(len(target.sources))):
            return None, f"{target.param_name}: shards missing ({[n for _, n in target.sources]})"
        shapes = [by_spec[name].shape for _, name in target.sources]
        rows, tails = sum(s[0] for s in shapes), {tuple(s[1:]) for s in shapes}
        if len(tails) != 1 or any(
            by_spec[n].dtype != by_spec[target.sources[0][1]].dtype for _, n in target.sources
        ):
            return None, f"{target.param_name}: parts differ in shape or dtype"
        module, param = target.module, params[target.param_name]
        method = getattr(module, "quant_method", None)
        if param.numel() == 0:
            # Packed and dropped at load: only an unquantized CPU linear is rebuilt here.
            expected = (
                getattr(module, "output_size_per_partition", None),
                getattr(module, "input_size_per_partition", None),
            )
            if not (
                platform_cpu
                and isinstance(module, LinearBase)
                and type(method) is UnquantizedLinearMethod
                and target.leaf == "weight"
                and (rows, *tails.pop()) == expected
            ):
                return None, f"{target.param_name} is packed in a way not planned for"
            target.repack = True
            continue
        padded = isinstance(module, VocabParallelEmbedding)
        if tuple(param.shape[1:]) != tails.pop() or not (
            rows == param.shape[0] or (padded and rows < param.shape[0])
        ):
            return None, f"{target.param_name}: {rows} rows do not fit {tuple(param.shape)}"
        if method is not None and not isinstance(
            method, UnquantizedLinearMethod | UnquantizedEmbeddingMethod
        ):
            return None, f"{target.param_name}: quantized ({type(method).__name__})"
    loaded = {params[name].data_ptr() for name in targets}
    reprocess = _embeddings_to_reprocess(model, loaded) if platform_cpu else []
    return DirectLoad(list(targets.values()), reprocess), "direct"


def _embeddings_to_reprocess(model: torch.nn.Module, loaded: set[int]) -> list[torch.nn.Module]:
    """The unquantized embeddings among the parameters loaded (CPU: their packed copies are
    rebuilt after a load)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    return [
        m
        for m in model.modules()
        if isinstance(m, VocabParallelEmbedding)
        and isinstance(getattr(m, "quant_method", None), UnquantizedEmbeddingMethod)
        and getattr(m, "weight").data_ptr() in loaded  # noqa: B009  # a Parameter, not a method
    ]
