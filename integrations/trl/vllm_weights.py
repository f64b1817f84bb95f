"""RLGuard's weight path as the weight sync of TRL's ``vllm_mode="server"``.

TRL's own sync pushes weights over an NCCL group the trainer joins as an extra rank: impossible
on a CPU trainer, and broken by a dead or restarted engine. :func:`use_rlguard_weight_sync`,
called before the trainer is built, swaps TRL's client for :class:`RLGuardVLLMClient` (for
:data:`integrations.trl.SUPPORTED_TRL` only), which generates as TRL's does but:

* ``init_communicator`` checks that the server runs RLGuard's worker extension and starts a
  weight registry and a publisher of :mod:`recovery.transfer` in the trainer process;
* ``update_named_params`` publishes the tensors as a new version, has every worker pull it
  (``/collective_rpc rlguard_refit``) and returns once every worker reports that version;
* ``generate`` first refits an engine that does not serve the current version, and retries a
  generation that failed because the engine died once it answers again (up to ``engine_wait``
  seconds), never blindly: a restarted engine is never sampled with stale weights.

Versions count up from one more than the newest the engine reports, so a restarted trainer never
asks a surviving engine for older weights. Starting the engine: ``docs/integrations.md``.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from integrations import IntegrationError
from integrations.trl.callback import waiting_for_engine
from integrations.vllm.client import EngineClient, EngineError, EngineRequestError
from integrations.vllm.worker_extension import DEFAULT_WEIGHT_SET, specs_of
from recovery.transfer import (
    InMemoryRegistry,
    Publication,
    RegistryServer,
    TransferError,
    WeightPublisher,
    make_transport,
)

log = logging.getLogger("rlguard.integrations.trl.vllm")

EXTENSION_CLS = "integrations.vllm.worker_extension.RLGuardWeightLoader"
_HOOKED_MODULE = "trl.generation.vllm_generation"
T = TypeVar("T")


class WeightSyncError(RuntimeError):
    """The engine could not be brought to the trainer's weights; the message says which engine,
    which version and why."""


@dataclass(frozen=True)
class WeightSyncOptions:
    """How the trainer serves its weights to the engine."""

    # tcp, or shm when the engine runs on the trainer's host
    transport: str = "tcp"
    # the address the registry and the publisher listen on: one the engine's workers can reach
    host: str = "127.0.0.1"
    weight_set: str = DEFAULT_WEIGHT_SET
    # the most one refit (pull, verify, load) may take
    refit_timeout: float = 120.0
    # how long a push or a generation waits for a dead engine to answer again (a replacement
    # started at the same address) before it fails
    engine_wait: float = 0.0

    def __post_init__(self) -> None:
        if self.transport not in ("tcp", "shm"):
            raise ValueError(f"transport must be tcp or shm, got {self.transport!r}")
        if not self.refit_timeout > 0:
            raise ValueError(f"refit_timeout must be positive, got {self.refit_timeout!r}")
        if self.engine_wait < 0:
            raise ValueError(f"engine_wait must be >= 0, got {self.engine_wait!r}")


@dataclass(frozen=True)
class Refit:
    """One refit of the engine: the version, how long it took end to end and the worker's own
    report (bytes, transfer and load seconds)."""

    version: int
    seconds: float
    detail: dict[str, Any]


def check_server_info(info: Mapping[str, Any], base_url: str) -> None:
    """Raise :class:`WeightSyncError` unless the server's resolved config (TRL's
    ``get_server_info()``) names RLGuard's worker extension."""
    parallel = info.get("parallel_config")
    named = parallel.get("worker_extension_cls") if isinstance(parallel, Mapping) else None
    if named != EXTENSION_CLS:
        raise WeightSyncError(
            f"the vLLM server at {base_url} does not run RLGuard's worker extension "
            f"(its worker_extension_cls is {named!r}): start it with --worker-extension-cls "
            f"{EXTENSION_CLS} and VLLM_SERVER_DEV_MODE=1 in its environment"
        )


class RLGuardWeightSync:
    """The trainer's side of the weight path to one vLLM server: a registry and a publisher of
    :mod:`recovery.transfer` in this process, and the engine's ``/collective_rpc`` calls."""

    def __init__(self, base_url: str, model: str, options: WeightSyncOptions) -> None:
        self.base_url = base_url
        self.options = options
        self.engine = EngineClient(base_url, model, timeout=options.refit_timeout)
        self.target: int | None = None  # the newest version published: what the engine must serve
        self.refits: list[Refit] = []
        self._next = 0
        self._specs: list[list[Any]] = []
        self._registry: RegistryServer | None = None
        self._publisher: WeightPublisher | None = None
        self._publications: dict[int, Publication] = {}

    # ---- life --------------------------------------------------------------------------------

    def open(self) -> None:
        """Check the engine answers RLGuard's calls, then start the registry and publisher."""
        served = self.served_versions()
        self._next = max((v for v in served if v is not None), default=-1) + 1
        registry = InMemoryRegistry()
        self._registry = RegistryServer(registry, host=self.options.host)
        self._publisher = WeightPublisher(
            self.options.weight_set,
            transport=make_transport(self.options.transport),
            registry=registry,
            host=self.options.host,
        )
        log.info(
            "RLGuard weight sync to %s: registry %s, %s, first version v%d",
            self.base_url,
            self._registry.address,
            self.options.transport,
            self._next,
        )

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
            self._publisher = None
        if self._registry is not None:
            self._registry.close()
            self._registry = None
        self.engine.close()

    # ---- what the engine serves --------------------------------------------------------------

    def served_versions(self) -> list[int | None]:
        """The weight version each worker of the engine serves (None: the weights it started
        with). Raises :class:`WeightSyncError` when the engine refuses RLGuard's call (it does not
        run the extension, or not in dev mode); :class:`EngineError` when it does not answer."""
        try:
            answers = self.engine.collective_rpc("rlguard_weight_version", timeout=30.0)
        except EngineRequestError as exc:
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} refused RLGuard's rlguard_weight_version "
                f"call ({exc}): start it with --worker-extension-cls {EXTENSION_CLS} and "
                "VLLM_SERVER_DEV_MODE=1"
            ) from exc
        versions: list[int | None] = []
        for answer in answers:
            version = answer.get("version") if isinstance(answer, dict) else answer
            if version is not None and not isinstance(version, int):
                raise WeightSyncError(f"{self.base_url}: a worker reported version {answer!r}")
            versions.append(version)
        if not versions:
            raise WeightSyncError(f"{self.base_url}: no worker answered rlguard_weight_version")
        return versions

    # ---- a new version -----------------------------------------------------------------------

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Publish ``named_params`` as the next version and bring the engine to it; the version.

        The tensors are copied: TRL hands over the live parameters, which the next optimizer
        step changes in place while the version may still be served (to a restarted engine)."""
        if self._publisher is None:
            raise WeightSyncError("the weight sync is not open (init_communicator was not called)")
        tensors = {
            name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in named_params
        }
        if not tensors:
            raise WeightSyncError("no tensors to publish")
        version = self._next
        self._specs = specs_of(tensors)
        try:
            self._publications[version] = self._publisher.publish(version, tensors, min_replicas=1)
        except TransferError as exc:
            raise WeightSyncError(f"publishing v{version} failed: {exc}") from exc
        self._next = version + 1
        previous, self.target = self.target, version
        self.ensure_current()
        if previous is not None:
            # The engine holds the new version; nothing should be served the old one again.
            self._publisher.retire(previous)
            self._publications.pop(previous, None)
        return version

    def _source(self, version: int) -> dict[str, Any]:
        assert self._registry is not None
        return {
            "registry": self._registry.address,
            "weight_set": self.options.weight_set,
            "transport": self.options.transport,
            "version": version,
            "specs": self._specs,
            "timeout": self.options.refit_timeout,
        }

    def ensure_current(self) -> None:
        """Return once every worker of the engine serves :attr:`target`, refitting it if needed.
        An engine that does not answer is waited for up to ``engine_wait`` seconds (then
        :class:`WeightSyncError`)."""
        if self.target is None:
            return
        deadline = time.monotonic() + self.options.engine_wait
        while True:
            try:
                if set(self.served_versions()) != {self.target}:
                    self._refit(self.target)
                return
            except EngineError as exc:
                if time.monotonic() >= deadline:
                    raise WeightSyncError(
                        f"the vLLM server at {self.base_url} cannot be refit to v{self.target}: {exc}"
                    ) from exc
                log.warning("engine %s unavailable (%s); waiting for it", self.base_url, exc)
                self._wait_healthy(deadline)

    def _wait_healthy(self, deadline: float) -> None:
        # The trainer is waiting, not hung: its heartbeat says so (RLGuard heals the engine).
        with waiting_for_engine():
            while time.monotonic() < deadline and not self.engine.healthy(timeout=2.0):
                time.sleep(0.5)

    def _refit(self, version: int) -> None:
        started = time.monotonic()
        results = self.engine.collective_rpc(
            "rlguard_refit", self._source(version), timeout=self.options.refit_timeout
        )
        publication = self._publications.get(version)
        if publication is not None:
            try:
                publication.wait_committed(timeout=self.options.refit_timeout)
            except TransferError as exc:
                raise WeightSyncError(f"v{version} was not committed: {exc}") from exc
        # Prompt prefixes cached with the old weights must not be reused with the new ones.
        self.engine.reset_prefix_cache()
        served = self.served_versions()
        if set(served) != {version}:
            raise WeightSyncError(
                f"the vLLM server at {self.base_url} was refit to v{version} but its workers "
                f"serve {served}"
            )
        detail = results[0] if results and isinstance(results[0], dict) else {}
        self.refits.append(Refit(version, round(time.monotonic() - started, 4), detail))
        log.info("engine %s serves v%d (%s)", self.base_url, version, detail)

    def guarded(self, call: Callable[[], T], is_engine_failure: Callable[[Exception], bool]) -> T:
        """``call()`` (a generation) on an engine that serves :attr:`target`; a failure of the
        engine itself is retried, after the same check, until ``engine_wait`` runs out."""
        deadline = time.monotonic() + self.options.engine_wait
        while True:
            self.ensure_current()
            try:
                return call()
            except Exception as exc:
                if not is_engine_failure(exc) or time.monotonic() >= deadline:
                    raise
                log.warning(
                    "generation on %s failed (%s); retrying once it serves v%s",
                    self.base_url,
                    exc,
                    self.target,
                )
                self._wait_healthy(deadline)


# ---- the hook into TRL -----------------------------------------------------------------------


def check_trl_version() -> str:
    """The installed TRL version; raises :class:`IntegrationError` naming it when the hook was
    not written for it (it relies on ``VLLMGeneration``'s internals, which TRL changes between
    minor releases)."""
    from integrations.trl import SUPPORTED_TRL, _check_range, _installed

    installed = _installed("trl")
    try:
        _check_range("trl", installed, SUPPORTED_TRL)
    except IntegrationError as exc:
        raise IntegrationError(
            f"RLGuard's vLLM weight sync hooks into trl {SUPPORTED_TRL[0]} up to (not including) "
            f"{SUPPORTED_TRL[1]} and refuses trl {installed}: {exc}"
        ) from None
    return installed


def _is_engine_failure(exc: Exception) -> bool:
    """Whether a failed TRL request means the engine is down (retry elsewhere in time), not that
    the request was wrong. TRL's client raises ``Exception("Request failed: <status>, ...")``."""
    import requests

    if isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout):
        return True
    text = str(exc)
    return text.startswith("Request failed: 5")


def _client_class(options: WeightSyncOptions) -> type:
    """TRL's ``VLLMClient`` with RLGuard's weight path (see the module docstring)."""
    from requests.adapters import HTTPAdapter
    from trl.generation.vllm_client import VLLMClient

    class RLGuardVLLMClient(VLLMClient):
        rlguard_options = options

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # No blind retries: a retried request could reach a restarted engine that still
            # holds its start-up weights; RLGuardWeightSync.guarded retries after a version check.
            adapter = HTTPAdapter(max_retries=0, pool_maxsize=64)
            self.session.mount("http://", adapter)
            self.session.mount("https://", adapter)
            self.rlguard: RLGuardWeightSync | None = None
            self._rlguard_pending: list[tuple[str, torch.Tensor]] | None = None

        def init_communicator(self, device: Any = 0) -> None:
            check_server_info(self.get_server_info(), self.base_url)
            sync = RLGuardWeightSync(self.base_url, self.model, self.rlguard_options)
            sync.open()
            self.rlguard = sync
            atexit.register(self.close_communicator)

        def _sync(self) -> RLGuardWeightSync:
            if self.rlguard is None:
                raise WeightSyncError("init_communicator was not called")
            return self.rlguard

        @contextmanager
        def weight_update(self) -> Iterator[None]:
            # Tensors sent one by one inside the block are published as one version at its end.
            self._rlguard_pending = []
            try:
                yield
                self._sync().push(self._rlguard_pending)
            finally:
                self._rlguard_pending = None

        def update_named_params(
            self,
            metadata: list[tuple[str, str, list[int]]],
            named_params: Iterator[tuple[str, torch.Tensor]],
        ) -> None:
            if self._rlguard_pending is not None:
                self._rlguard_pending += [(n, t.detach().clone()) for n, t in named_params]
                return
            self._sync().push(_checked(metadata, named_params))

        def generate(self, *args: Any, **kwargs: Any) -> Any:
            base = super().generate
            if self.rlguard is None:
                return base(*args, **kwargs)
            return self.rlguard.guarded(lambda: base(*args, **kwargs), _is_engine_failure)

        def close_communicator(self) -> None:
            if self.rlguard is not None:
                self.rlguard.close()
                self.rlguard = None

    return RLGuardVLLMClient


def _checked(
    metadata: list[tuple[str, str, list[int]]], named_params: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_params``, checked against TRL's announced ``(name, dtype, shape)`` triplets."""
    expected = iter(metadata)
    for name, tensor in named_params:
        want = next(expected, None)
        got = (name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape))
        if want is not None and (want[0], want[1], list(want[2])) != got:
            raise WeightSyncError(f"TRL announced {want} but sent {got}")
        yield name, tensor


def use_rlguard_weight_sync(**options: Any) -> type:
    """Make every ``GRPOTrainer(..., args=GRPOConfig(use_vllm=True, vllm_mode="server"))`` built
    after this call sync its weights through RLGuard (see the module docstring); ``options`` are
    :class:`WeightSyncOptions` fields. Returns the client class now in use. Raises
    :class:`IntegrationError` for a TRL version the hook does not support, and leaves TRL as it
    was."""
    check_trl_version()
    settings = WeightSyncOptions(**options)
    import importlib

    module = importlib.import_module(_HOOKED_MODULE)
    current = getattr(module, "VLLMClient", None)
    if current is None:
        raise IntegrationError(
            f"{_HOOKED_MODULE} has no VLLMClient: this TRL is not one the hook knows"
        )
    original = getattr(current, "_rlguard_original", current)
    cls = _client_class(settings)
    cls._rlguard_original = original  # type: ignore[attr-defined]  # set once, read above
    setattr(module, "VLLMClient", cls)  # noqa: B010 - the one name the hook replaces
    return cls


def remove_rlguard_weight_sync() -> None:
    """Put TRL's own ``VLLMClient`` back (trainers built afterwards use NCCL again)."""
    import importlib

    module = importlib.import_module(_HOOKED_MODULE)
    original = getattr(getattr(module, "VLLMClient", None), "_rlguard_original", None)
    if original is not None:
        setattr(module, "VLLMClient", original)  # noqa: B010 - a module TRL does not type
