"""RLGuard's weight path into a vLLM engine: a worker extension driven by ``/collective_rpc``.

Start the engine with ``--worker-extension-cls
integrations.vllm.worker_extension.RLGuardWeightLoader`` and ``VLLM_SERVER_DEV_MODE=1`` (which
serves ``/collective_rpc``); its methods then run in every Worker process, called by name::

    POST /collective_rpc {"method": "rlguard_refit", "args": [SOURCE]}

``rlguard_refit`` pulls one version of the trainer's weights through :mod:`recovery.transfer`
(from the trainer or any engine that holds it: a relay), verifies every chunk, loads it straight
into the model's parameters (:mod:`integrations.vllm.direct_load`; vLLM's in-place reload when
the plan does not fit, or with ``"direct": false``) and remembers the version, which
``rlguard_weight_version`` reports. The receiver is kept between refits: it relays the version
the engine serves, and refuses a refit to a version not newer than the one loaded. Why not
vLLM's weight-transfer engine: ``docs/integrations.md`` ("vLLM as the rollout engine").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from integrations.vllm.direct_load import DirectLoad, plan_direct_load
from recovery.transfer import RegistryClient, TensorSpec, WeightReceiver, make_transport

log = logging.getLogger("rlguard.integrations.vllm")

# The weight set the trainer publishes and the engines pull (one per job).
DEFAULT_WEIGHT_SET = "policy"


def parse_source(source: Mapping[str, Any]) -> tuple[str, str, str, int, list[TensorSpec]]:
    """(registry address, weight set, transport, version, specs) of a refit request; a bad
    request raises ValueError naming the bad field (vLLM returns it to the caller)."""
    registry = source.get("registry")
    if not isinstance(registry, str) or ":" not in registry:
        raise ValueError(f"refit: registry must be 'host:port', got {registry!r}")
    weight_set = source.get("weight_set", DEFAULT_WEIGHT_SET)
    if not isinstance(weight_set, str) or not weight_set:
        raise ValueError(f"refit: weight_set must be a name, got {weight_set!r}")
    transport = source.get("transport", "tcp")
    if transport not in ("tcp", "shm"):
        raise ValueError(f"refit: transport must be tcp or shm, got {transport!r}")
    version = source.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"refit: version must be an int >= 0, got {version!r}")
    raw = source.get("specs")
    if not isinstance(raw, list) or not raw:
        raise ValueError(
            f"refit: specs must be a non-empty list of [name, dtype, shape], got {raw!r}"
        )
    specs = []
    for item in raw:
        if not (isinstance(item, list | tuple) and len(item) == 3):
            raise ValueError(f"refit: a spec must be [name, dtype, shape], got {item!r}")
        name, dtype, shape = item
        specs.append(TensorSpec(str(name), str(dtype), tuple(int(d) for d in shape)))
    return registry, weight_set, transport, version, specs


def specs_of(tensors: Mapping[str, torch.Tensor]) -> list[list[Any]]:
    """The ``specs`` field of a refit request for the tensors a trainer publishes."""
    out: list[list[Any]] = []
    for name, tensor in tensors.items():
        spec = TensorSpec.of(name, tensor)
        out.append([spec.name, spec.dtype, list(spec.shape)])
    return out


class RLGuardWeightLoader:
    """Mixed into vLLM's worker class by ``--worker-extension-cls``: ``self`` is the Worker."""

    _rlguard_receiver: WeightReceiver | None = None
    _rlguard_version: int | None = None
    _rlguard_key: tuple[str, str, str, tuple[TensorSpec, ...]] | None = None
    # The direct load's plan, for the model and the specs it was made for: made at the first
    # refit, not at each. It names modules, which vLLM's reloads keep (they load in place), and
    # is used again only while the parameters' shapes are still those it planned for.
    _rlguard_plan: tuple[torch.nn.Module, tuple[TensorSpec, ...], DirectLoad | None, str] | None = (
        None
    )

    def _rlguard_receiver_for(
        self, registry: str, weight_set: str, transport: str, specs: Sequence[TensorSpec]
    ) -> WeightReceiver:
        key = (registry, weight_set, transport, tuple(specs))
        if self._rlguard_receiver is None or self._rlguard_key != key:
            if self._rlguard_receiver is not None:
                self._rlguard_receiver.close()
            self._rlguard_receiver = WeightReceiver(
                weight_set,
                specs,
                transport=make_transport(transport),
                registry=RegistryClient(registry, timeout=5.0),
                timeout=5.0,
            )
            self._rlguard_key = key
        return self._rlguard_receiver

    def rlguard_refit(self, source: dict[str, Any]) -> dict[str, Any]:
        """Pull ``source["version"]`` of the trainer's weights and load it; the version now
        served and how long the pull and the load took."""
        called = time.monotonic()
        registry, weight_set, transport, version, specs = parse_source(source)
        timeout = float(source.get("timeout", 60.0))
        receiver = self._rlguard_receiver_for(registry, weight_set, transport, specs)
        if receiver.live_version == version and self._rlguard_version == version:
            return {"version": version, "pulled": False, "transfer_s": 0.0, "load_s": 0.0}
        started = time.monotonic()
        report = receiver.pull(version, timeout=timeout)
        pulled = time.monotonic()
        load_path, stages = self._rlguard_load_live(
            receiver, specs, direct=bool(source.get("direct", True))
        )
        self._rlguard_version = version
        return {
            "version": version,
            "pulled": True,
            "sources": dict(report.chunks_by_source),
            "bytes": report.bytes,
            "transfer_s": round(report.transfer_seconds, 6),
            "stream_s": round(report.stream_seconds, 6),
            "commit_wait_s": round(pulled - started - report.transfer_seconds, 6),
            "load_s": round(time.monotonic() - pulled, 6),
            "load_path": load_path,
            # the load's own split: planning, copies into the parameters, packing again
            **{name: round(value, 6) for name, value in stages.items()},
            # all of this call inside the worker (the rest of a refit's time is the RPC's)
            "worker_s": round(time.monotonic() - called, 6),
            "relay": receiver.address,
        }

    def _rlguard_load_live(
        self, receiver: WeightReceiver, specs: Sequence[TensorSpec], *, direct: bool
    ) -> tuple[str, dict[str, float]]:
        """Load the receiver's live version: straight into the parameters when the layout is
        one :mod:`integrations.vllm.direct_load` plans for, else through vLLM's in-place
        reload; which path it took ("direct", or why not) and the seconds of its stages."""
        from vllm.distributed import get_tensor_model_parallel_world_size
        from vllm.platforms import current_platform

        started = time.monotonic()
        plan, why = None, "direct load not asked for"
        if direct:
            model = self.model_runner.get_model()  # type: ignore[attr-defined]  # the Worker's
            cached = self._rlguard_plan
            if (
                cached is not None
                and cached[0] is model
                and cached[1] == tuple(specs)
                and (cached[2] is None or cached[2].still_fits())
            ):
                plan, why = cached[2], cached[3]
            else:
                plan, why = plan_direct_load(
                    model,
                    specs,
                    tensor_parallel=get_tensor_model_parallel_world_size(),
                    platform_cpu=current_platform.is_cpu(),
                )
                self._rlguard_plan = (model, tuple(specs), plan, why)
        planned = time.monotonic()
        if plan is None:
            log.info("refit through vLLM's in-place reload: %s", why)
            self._rlguard_load(receiver.live_tensors.items())
            return f"vllm-reload ({why})", {"plan_s": planned - started}
        return "direct", {"plan_s": planned - started, **plan.load(receiver.live_tensors)}

    def rlguard_load_from_disk(self, model_dir: str, version: int) -> dict[str, Any]:
        """The baseline a refit is measured against: vLLM's own in-place reload of the same
        weights from a Hugging Face directory (what an engine restarted from a checkpoint on
        disk, or vLLM's ``reload_weights`` from a path, pays)."""
        started = time.monotonic()
        self.reload_weights(  # type: ignore[attr-defined]  # the Worker's
            weights_path=str(model_dir), is_checkpoint_format=True
        )
        self._rlguard_repack_tied()
        self._rlguard_version = int(version)
        return {"version": int(version), "load_s": round(time.monotonic() - started, 6)}

    def _rlguard_load(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        # vLLM's in-place reload (layer by layer, in checkpoint format): the model's own
        # load_weights alone fails once a layer's weights were processed for the kernels
        # (on CPU the linear layers' are: their parameters lose their weight_loader).
        self.reload_weights(  # type: ignore[attr-defined]  # the Worker's
            weights_iterator=list(items), is_checkpoint_format=True
        )
        self._rlguard_repack_tied()

    def _rlguard_repack_tied(self) -> None:
        """On CPU the output head computes with a packed copy of its weight, made when the model
        was loaded; with tied embeddings vLLM's in-place reload processes only the embedding
        (its documented limitation for tied parameters), so the head would keep sampling from
        the old weights. Tie the head to the new embedding again and repack both."""
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        model = self.model_runner.get_model()  # type: ignore[attr-defined]  # the Worker's
        config = getattr(model, "config", None)
        head, inner = getattr(model, "lm_head", None), getattr(model, "model", None)
        if getattr(config, "tie_word_embeddings", False) and head is not None and inner is not None:
            head.weight = inner.embed_tokens.weight
        for module in model.modules():
            if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)

    def rlguard_weight_version(self) -> dict[str, int | None]:
        """The weight version this worker serves (None: the weights it started with), as
        ``{"version": v}`` (``/collective_rpc`` passes dicts through, and turns ints to text)."""
        return {"version": self._rlguard_version}
