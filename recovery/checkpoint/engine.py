"""The checkpoint engine: a memory copy in the training loop, everything else in the background.

``save()`` validates the state, copies every tensor into reusable host buffers (one flat buffer per
layer, grown only when the state grows) and returns a :class:`SaveHandle`. A background thread
then writes the buffers through :mod:`recovery.checkpoint.atomic` (temporary directory → fsync →
CRC-32C (or SHA-256) → rename → ``COMMITTED`` marker), optionally mirrors the committed directory to a second
root, and applies retention. Because the buffers are reused, a save never overlaps the previous
one: it waits for it or is refused (``when_busy``).

On disk a checkpoint is ``<root>/ckpt-<seq>/`` holding ``core.bin`` (and ``aux.bin`` when an aux
component was given), ``manifest.json`` (each component's JSON skeleton and tensor slots) and the
``COMMITTED`` marker (checksums, the version vector, the step → weight-version table, the layers
and the transient components the caller must clear on restore). ``seq`` increases with every save
of a root, so "newest" is the last thing written, even after a rollback to an older version.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from recovery._closing import ClosesOnExit
from recovery.checkpoint import _serialize, atomic
from recovery.checkpoint.errors import (
    CheckpointBusy,
    CheckpointInputError,
    CheckpointWriteError,
)
from recovery.checkpoint.layout import (
    MANIFEST,
    MARKER,
    apply_retention,
    list_dirs,
    mirror_committed,
)
from recovery.checkpoint.reader import (
    PERSISTED_LAYERS,
    CheckpointInfo,
    CheckpointReader,
    Layer,
    SkippedCheckpoint,
)
from recovery.checkpoint.version import VersionVector, WeightVersionTable
from recovery.errors import RecoveryTimeout
from recovery.fsio import TMP_PREFIX

log = logging.getLogger("rlguard.recovery.checkpoint")

# The reader's types stay importable from here, where callers have always found them.
__all__ = [
    "DEFAULT_LAYERS",
    "DEFAULT_REQUIRED_CORE",
    "DEFAULT_TRANSIENT",
    "MANIFEST",
    "MARKER",
    "PERSISTED_LAYERS",
    "CheckpointEngine",
    "CheckpointInfo",
    "CheckpointReader",
    "Layer",
    "SaveHandle",
    "SkippedCheckpoint",
]

# The default layer of each well-known component (seed 002, §3.3). Callers may pass their own map.
DEFAULT_LAYERS: dict[str, Layer] = {
    "model": "core",
    "optimizer": "core",
    "lr_scheduler": "core",
    "step": "core",
    "inference_weight_version": "core",
    "generation_config": "core",
    "experience_buffer": "aux",
    "rollout_stats": "aux",
    "kv_cache": "transient",
    "request_queue": "transient",
    "dataloader_position": "transient",
}
DEFAULT_REQUIRED_CORE: tuple[str, ...] = tuple(k for k, v in DEFAULT_LAYERS.items() if v == "core")
DEFAULT_TRANSIENT: tuple[str, ...] = tuple(k for k, v in DEFAULT_LAYERS.items() if v == "transient")


class SaveHandle:
    """The background part of one ``save()``: poll ``done``/``error`` or ``wait()`` for it."""

    def __init__(self, seq: int, version: VersionVector, blocking_seconds: float) -> None:
        self.seq = seq
        self.version = version
        self.blocking_seconds = blocking_seconds
        self._committed = threading.Event()
        self._finished = threading.Event()
        self._info: CheckpointInfo | None = None
        self._error: BaseException | None = None
        self.mirror_error: BaseException | None = None

    @property
    def done(self) -> bool:
        """True once the local checkpoint is committed or the write has failed."""
        return self._committed.is_set()

    @property
    def error(self) -> BaseException | None:
        """The failure of the background write, if it failed."""
        return self._error

    def wait(self, timeout: float) -> CheckpointInfo:
        """Block until the local commit; raises the write's error or :class:`RecoveryTimeout`."""
        if not self._committed.wait(timeout):
            raise RecoveryTimeout(f"checkpoint {self.seq} not committed within {timeout} s")
        if self._error is not None:
            raise CheckpointWriteError(f"checkpoint {self.seq} failed: {self._error!r}") from (
                self._error
            )
        assert self._info is not None
        return self._info

    def wait_finished(self, timeout: float) -> None:
        """Block until the whole background job (commit, mirror, retention) has ended."""
        if not self._finished.wait(timeout):
            raise RecoveryTimeout(f"checkpoint {self.seq} background job still running")

    @property
    def finished(self) -> bool:
        """True once the buffers are free again (commit, mirror and retention are over)."""
        return self._finished.is_set()


def _check_layers(
    state: Mapping[str, Any], layers: Mapping[str, str], required_core: Iterable[str]
) -> dict[str, list[str]]:
    if not isinstance(state, Mapping) or not state:
        raise CheckpointInputError(
            f"state must be a non-empty mapping of components, got {state!r:.80}"
        )
    by_layer: dict[str, list[str]] = {"core": [], "aux": [], "transient": []}
    for name in state:
        if not isinstance(name, str) or not name:
            raise CheckpointInputError(f"component names must be non-empty strings, got {name!r}")
        layer = layers.get(name)
        if layer is None:
            raise CheckpointInputError(f"component {name!r} has no layer (core, aux or transient)")
        if layer not in by_layer:
            raise CheckpointInputError(f"component {name!r} has unknown layer {layer!r}")
        by_layer[layer].append(name)
    missing = [c for c in required_core if c not in by_layer["core"]]
    if missing:
        raise CheckpointInputError(f"core components missing from the state: {missing}")
    return by_layer


def _flatten(
    state: Mapping[str, Any], by_layer: Mapping[str, list[str]]
) -> tuple[dict[str, _serialize.Flattener], dict[str, Any]]:
    """Each persisted layer's flattened tensors, and each component's skeleton (its JSON
    structure with tensor indices that count within its layer's file)."""
    flat: dict[str, _serialize.Flattener] = {}
    skeletons: dict[str, Any] = {}
    for layer in PERSISTED_LAYERS:
        if not by_layer[layer]:
            continue
        flattener = _serialize.Flattener()
        for name in by_layer[layer]:
            skeletons[name] = {"layer": layer, "value": flattener.encode(state[name], name)}
        flat[layer] = flattener
    return flat, skeletons


class CheckpointEngine(CheckpointReader, ClosesOnExit):
    """Asynchronous, crash-safe checkpoints under ``root`` with retention and an optional mirror.

    ``when_busy``: ``"wait"`` (a save waits up to its ``timeout`` for the previous one) or
    ``"refuse"`` (raises :class:`CheckpointBusy`). ``mirror``: a second root (e.g. a network
    filesystem) the committed checkpoint is copied to in the background; ``keep`` applies to both.
    Only one process may save into a root at a time (an ``flock`` taken at the first save).
    Reading (``latest``/``load``) needs no lock. ``checksum``: ``"crc32c"`` (default; the CPU's
    CRC instruction, ~12 GB/s on one core, so verifying a restore costs no more than reading it),
    ``"sha256"`` (cryptographic, ~1.2 GB/s) or ``"crc32"`` (zlib, ~2 GB/s; kept so roots written
    with it stay readable). The CRCs catch every burst error up to 32 bits and random damage
    with probability 1 - 2^-32. Readers take the algorithm from the marker, so a root may mix
    them. ``direct_io``: write the layer files with ``O_DIRECT`` from the (block-aligned) host
    buffers, skipping the kernel's copy into the page cache; filesystems without it fall back to
    buffered writes.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        keep: int = 3,
        when_busy: Literal["wait", "refuse"] = "wait",
        mirror: Path | str | None = None,
        layers: Mapping[str, str] | None = None,
        required_core: Iterable[str] = DEFAULT_REQUIRED_CORE,
        pin_memory: bool = False,
        lock_timeout: float = 10.0,
        checksum: Literal["crc32c", "sha256", "crc32"] = "crc32c",
        direct_io: bool = True,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise CheckpointInputError(f"keep must be an int >= 1, got {keep!r}")
        if checksum not in atomic.CHECKSUMS:
            raise CheckpointInputError(
                f"checksum must be one of {atomic.CHECKSUMS}, got {checksum!r}"
            )
        if when_busy not in ("wait", "refuse"):
            raise CheckpointInputError(f"when_busy must be 'wait' or 'refuse', got {when_busy!r}")
        super().__init__(Path(root))
        self.root.mkdir(parents=True, exist_ok=True)
        self.mirror = Path(mirror) if mirror is not None else None
        if self.mirror is not None:
            if self.mirror.resolve() == self.root.resolve():
                raise CheckpointInputError(f"mirror {self.mirror} is the same directory as root")
            self.mirror.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.when_busy = when_busy
        self.layers: dict[str, str] = dict(DEFAULT_LAYERS if layers is None else layers)
        self.required_core = tuple(required_core)
        self.pin_memory = pin_memory and torch.cuda.is_available()
        self.lock_timeout = lock_timeout
        self.checksum = checksum
        self.direct_io = direct_io
        self._buffers: dict[str, torch.Tensor] = {}
        self._current: SaveHandle | None = None
        self._save_lock = threading.Lock()
        self._lock_fd: int | None = None
        self._next_seq: int | None = None

    # ---- writer side -------------------------------------------------------------------------

    def _acquire_writer_lock(self) -> None:
        if self._lock_fd is not None:
            return
        fd = os.open(self.root / ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise RecoveryTimeout(
                        f"another process is saving into {self.root} (lock held > {self.lock_timeout} s)"
                    ) from None
                time.sleep(0.01)
        self._lock_fd = fd
        # We are the only writer now: whatever temporary directories exist were left by a writer
        # that died; they never became checkpoints.
        for root in (self.root, self.mirror):
            if root is None:
                continue
            for stale in root.glob(f"{TMP_PREFIX}*"):
                log.info("removing %s left by an interrupted save", stale)
                shutil.rmtree(stale, ignore_errors=True)
        self._next_seq = max((s for s, _ in list_dirs(self.root)), default=0) + 1

    def _ensure_buffer(self, layer: str, size: int) -> torch.Tensor:
        buf = self._buffers.get(layer)
        if buf is None or buf.numel() < size:
            # Grow with headroom so a state that grows a little does not reallocate every time.
            capacity = max(size, int(size * 1.1)) if buf is not None else size
            capacity = max(capacity, 1)
            # Start on a device-block boundary so the background write can use O_DIRECT.
            raw = torch.empty(
                capacity + atomic.DIRECT_ALIGN, dtype=torch.uint8, pin_memory=self.pin_memory
            )
            offset = (-raw.data_ptr()) % atomic.DIRECT_ALIGN
            buf = raw[offset : offset + capacity]
            self._buffers[layer] = buf
        return buf

    def preallocate(
        self,
        state: Mapping[str, Any],
        *,
        layers: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> dict[str, int]:
        """Allocate and fault in the host buffers ``state`` needs now (at startup, say), so even
        the first ``save()`` blocks only for the copy. Returns the bytes reserved per layer."""
        layer_map = self.layers if layers is None else dict(layers)
        by_layer = _check_layers(state, layer_map, self.required_core)
        sizes: dict[str, int] = {}
        for layer in PERSISTED_LAYERS:
            flattener = _serialize.Flattener()
            for name in by_layer[layer]:
                flattener.encode(state[name], name)
            if by_layer[layer]:
                sizes[layer] = flattener.size
        with self._save_lock:
            previous = self._current
            if previous is not None:
                previous.wait_finished(timeout)  # never touch a buffer that is being written
            for layer_name, size in sizes.items():
                self._ensure_buffer(layer_name, size).zero_()
        return sizes

    def save(
        self,
        state: Mapping[str, Any],
        *,
        version: VersionVector,
        layers: Mapping[str, str] | None = None,
        weight_versions: WeightVersionTable | None = None,
        timeout: float = 600.0,
    ) -> SaveHandle:
        """Copy ``state`` to host buffers and write it in the background; returns at once after.

        ``state`` maps component names (``model``, ``optimizer``, ...) to values; ``layers``
        (default: the engine's map) gives each component's layer. Transient components are not
        written, only listed in the marker. Bad input raises :class:`CheckpointInputError` before
        anything changes. With ``when_busy="wait"`` the call waits up to ``timeout`` seconds for the
        previous save to finish.
        """
        started = time.perf_counter()
        if not isinstance(version, VersionVector):
            raise CheckpointInputError(f"version must be a VersionVector, got {version!r}")
        table = weight_versions if weight_versions is not None else WeightVersionTable()
        if not isinstance(table, WeightVersionTable):
            raise CheckpointInputError(
                f"weight_versions must be a WeightVersionTable, got {table!r}"
            )
        by_layer = _check_layers(
            state, self.layers if layers is None else dict(layers), self.required_core
        )
        flat, skeletons = _flatten(state, by_layer)
        with self._save_lock:
            self._wait_for_previous_locked(timeout)
            self._acquire_writer_lock()
            assert self._next_seq is not None
            seq = self._next_seq
            self._next_seq += 1
            sizes: dict[str, int] = {}
            for layer_name, flattener in flat.items():
                buf = self._ensure_buffer(layer_name, flattener.size)
                _serialize.copy_into(buf, flattener.tensors, flattener.slots)
                sizes[layer_name] = flattener.size
            # The device-to-host copies into pinned buffers were queued asynchronously, on the
            # stream of each tensor's own GPU.
            for device in {t.device for f in flat.values() for t in f.tensors if t.is_cuda}:
                torch.cuda.synchronize(device)
            # Tensor indices in a skeleton count within its layer's file.
            manifest = {
                "components": skeletons,
                "slots": {layer: [s.as_json() for s in f.slots] for layer, f in flat.items()},
            }
            metadata = {
                "seq": seq,
                "version": version.as_json(),
                "weight_versions": table.as_json(),
                "layers": {
                    layer: names for layer, names in by_layer.items() if layer != "transient"
                },
                "transient": sorted(set(by_layer["transient"])),
                "created_at": time.time(),
            }
            handle = SaveHandle(seq, version, time.perf_counter() - started)
            self._current = handle
            thread = threading.Thread(
                target=self._background,
                args=(handle, sizes, manifest, metadata),
                name=f"rlguard-ckpt-{seq}",
                daemon=True,
            )
            thread.start()
        return handle

    def _wait_for_previous_locked(self, timeout: float) -> None:
        """Return once the previous save's buffers are free (or refuse, per ``when_busy``)."""
        previous = self._current
        if previous is None or previous.finished:
            return
        if self.when_busy == "refuse":
            raise CheckpointBusy(f"checkpoint {previous.seq} is still being written; save refused")
        try:
            previous.wait_finished(timeout)
        except RecoveryTimeout:
            raise RecoveryTimeout(
                f"previous checkpoint {previous.seq} still writing after {timeout} s; "
                "nothing was saved"
            ) from None

    def _background(
        self,
        handle: SaveHandle,
        sizes: dict[str, int],
        manifest: dict[str, Any],
        metadata: dict[str, Any],
    ) -> None:
        final = self.root / f"ckpt-{handle.seq:010d}"
        tmp: Path | None = None
        try:
            tmp = atomic.make_tmp_dir(self.root, final.name)
            digests = []
            for layer, size in sizes.items():
                data = self._buffers[layer][:size].numpy().data
                digests.append(
                    atomic.write_file_durable(
                        tmp / f"{layer}.bin", data, checksum=self.checksum, direct=self.direct_io
                    )
                )
            encoded = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
            digests.append(
                atomic.write_file_durable(tmp / MANIFEST, encoded, checksum=self.checksum)
            )
            body = atomic.commit_dir(
                tmp, final, files=digests, marker_name=MARKER, metadata=metadata
            )
            handle._info = CheckpointInfo.from_marker(final, body)
            log.info("checkpoint %s committed at %s", final.name, handle.version)
        except BaseException as exc:  # reported through the handle, never swallowed
            handle._error = exc
            log.error("checkpoint %s failed: %r", final.name, exc)
            if tmp is not None and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
            handle._committed.set()
            handle._finished.set()
            return
        handle._committed.set()
        try:
            if self.mirror is not None:
                mirror_committed(final, self.mirror, body)
                apply_retention(self.mirror, self.keep)
            apply_retention(self.root, self.keep)
        except BaseException as exc:  # the local checkpoint is safe; the mirror is best effort
            handle.mirror_error = exc
            log.error("mirroring/retention after %s failed: %r", final.name, exc)
        finally:
            handle._finished.set()

    def close(self, timeout: float = 600.0) -> None:
        """Wait for the background job, release the writer lock and the host buffers."""
        current = self._current
        if current is not None:
            current.wait_finished(timeout)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._buffers.clear()
        self._prefetched = None
