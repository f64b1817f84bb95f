"""Actor shard snapshots and rebuild: lose a shard, rebuild it from checkpoint + snapshot.

Every ``snapshot_interval_steps`` (default 25, distinct from the full checkpoint interval) a
shard writes a light snapshot: its optimizer state and the diff of its parameters against the
last full checkpoint. The diff is a bitwise XOR of the raw parameter bits, so ``base ^ diff``
gives back exactly the lost parameters (floating-point subtraction would not round-trip), and
tensors that did not change since the checkpoint are not stored at all.

Snapshots are committed with the same temp → fsync → checksum → rename → marker recipe as
checkpoints (:mod:`recovery.checkpoint.atomic`); a reader only trusts snapshots whose marker and
file checksums verify. The base state comes from the caller through ``load_base`` so this module
does not depend on how the checkpoint engine lays out its files.

Rebuilding marks the shard stale (the scheduler sends it no rollouts), rebuilds it, checks the
result against the per-tensor checksums (crc32c or crc32) recorded at snapshot time, and marks it live again. Rebuild
times feed ``actor_shard_rebuild_count_5m``.
"""

from __future__ import annotations

import io
import logging
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recovery.checkpoint.atomic import (
    commit_dir,
    make_tmp_dir,
    read_marker,
    remove_dir,
    verify_committed_dir,
    write_file_durable,
)
from recovery.checkpoint.errors import CheckpointCorrupt
from recovery.errors import RecoveryError
from recovery.fsio import TMP_PREFIX
from recovery.transfer.errors import TransferConfigError
from recovery.transfer.manifest import DEFAULT_CHECKSUM, Checksum, checksum_function

log = logging.getLogger("rlguard.recovery.shards")

MARKER = "SNAPSHOT_COMPLETE.json"
DIFF_FILE = "param_diff.bin"
OPTIMIZER_FILE = "optimizer.pt"
REBUILD_WINDOW_S = 300.0
_ALIGN = 64
_SHARD_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_SNAP_DIR = re.compile(r"^snap-(\d{12})$")
# Integer dtype of each element size: the XOR diff works on raw bits.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

LIVE = "live"
STALE = "stale"


class ShardError(RecoveryError):
    """Base class of shard snapshot and rebuild failures."""


class ShardInputError(ShardError, ValueError):
    """A bad argument (named in the message); nothing was written or changed."""


class ShardRebuildError(ShardError):
    """The shard could not be rebuilt (no usable base, mismatched layout, checksum mismatch)."""


@dataclass(frozen=True)
class BaseShard:
    """The shard as of the latest full checkpoint: its step, parameters and optimizer state."""

    step: int
    params: Mapping[str, torch.Tensor]
    optimizer_state: Mapping[str, Any] = field(default_factory=dict)


BaseLoader = Callable[[str], BaseShard]


@dataclass(frozen=True)
class SnapshotInfo:
    """A committed, verified snapshot."""

    shard_id: str
    step: int
    base_step: int
    path: Path
    changed_tensors: int
    diff_bytes: int


@dataclass
class RebuiltShard:
    """A rebuilt shard: parameters and optimizer state as of ``step``."""

    shard_id: str
    step: int
    params: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    from_snapshot: bool
    seconds: float


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.reshape(-1)
    if tensor.dtype == torch.bool:
        return flat.view(torch.uint8)
    return flat.view(_BITS[tensor.element_size()])


def _digest(tensor: torch.Tensor, digest_of: Checksum) -> int:
    if tensor.numel() == 0:
        return 0
    return digest_of(tensor.reshape(-1).view(torch.uint8).numpy().data)


class _ResultMismatch(ShardError):
    """Applying a snapshot did not reproduce the recorded checksums (a corrupt diff)."""


def _spec(tensor: torch.Tensor) -> list[Any]:
    return [str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]


class ShardSnapshotter:
    """Writes shard snapshots under ``root`` and rebuilds shards from checkpoint + snapshot.

    One writer per shard at a time (the shard's own rank); any process may read and rebuild.
    ``load_base`` is the default base loader for :meth:`rebuild_shard`; ``clock`` gives
    wall-clock seconds for rebuild timestamps.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        snapshot_interval_steps: int = 25,
        keep: int = 2,
        load_base: BaseLoader | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(snapshot_interval_steps, int) or snapshot_interval_steps < 1:
            raise ShardInputError(
                f"snapshot_interval_steps must be an int >= 1, got {snapshot_interval_steps!r}"
            )
        if not isinstance(keep, int) or keep < 1:
            raise ShardInputError(f"keep must be an int >= 1, got {keep!r}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.snapshot_interval_steps = snapshot_interval_steps
        self.keep = keep
        self._load_base = load_base
        self._clock = clock
        self._lock = threading.Lock()
        self._state: dict[str, str] = {}
        self._rebuilds: deque[float] = deque()

    # ---- writing -------------------------------------------------------------------------

    def _shard_dir(self, shard_id: str) -> Path:
        if not isinstance(shard_id, str) or not _SHARD_ID.fullmatch(shard_id):
            raise ShardInputError(f"shard_id must match {_SHARD_ID.pattern}, got {shard_id!r}")
        return self.root / shard_id

    def should_snapshot(self, step: int) -> bool:
        """True on every ``snapshot_interval_steps``-th step."""
        return step > 0 and step % self.snapshot_interval_steps == 0

    def maybe_snapshot(
        self,
        shard_id: str,
        step: int,
        params: Mapping[str, torch.Tensor],
        optimizer_state: Mapping[str, Any],
        base: BaseShard,
    ) -> SnapshotInfo | None:
        """Snapshot if ``step`` is on the interval; returns the snapshot or None."""
        if not self.should_snapshot(step):
            return None
        return self.snapshot(shard_id, step, params, optimizer_state, base)

    def snapshot(
        self,
        shard_id: str,
        step: int,
        params: Mapping[str, torch.Tensor],
        optimizer_state: Mapping[str, Any],
        base: BaseShard,
    ) -> SnapshotInfo:
        """Write and commit a snapshot of ``params`` (as a diff against ``base``) at ``step``."""
        shard_dir = self._shard_dir(shard_id)
        self._check_snapshot_input(step, params, base)
        shard_dir.mkdir(parents=True, exist_ok=True)
        final = shard_dir / f"snap-{step:012d}"
        if final.exists():
            try:
                read_marker(final, MARKER)
            except CheckpointCorrupt:
                # A writer killed between rename and marker: the directory was never a snapshot.
                log.warning("replacing unmarked snapshot directory", extra={"path": str(final)})
                shutil.rmtree(final)
            else:
                raise ShardInputError(f"shard {shard_id!r} already has a snapshot at step {step}")
        self._sweep_tmp(shard_dir)
        index: list[dict[str, Any]] = []
        changed: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        digest_of = checksum_function(DEFAULT_CHECKSUM)
        digests: dict[str, int] = {}
        for name, tensor in params.items():
            current = tensor.detach().contiguous()
            digests[name] = _digest(current, digest_of)
            if not torch.equal(_bits(current), _bits(base.params[name].contiguous())):
                changed.append((name, current, base.params[name].contiguous()))
        total = sum(-(-c.numel() * c.element_size() // _ALIGN) * _ALIGN for _, c, _ in changed)
        buffer = torch.empty(total, dtype=torch.uint8)
        offset = 0
        for name, current, old in changed:
            nbytes = current.numel() * current.element_size()
            out = buffer[offset : offset + nbytes].view(_bits(current).dtype)
            torch.bitwise_xor(_bits(current), _bits(old), out=out)
            index.append({"name": name, "offset": offset, "nbytes": nbytes})
            offset += -(-nbytes // _ALIGN) * _ALIGN
        blob = io.BytesIO()
        torch.save(dict(optimizer_state), blob)
        tmp = make_tmp_dir(shard_dir, f"snap-{step}")
        try:
            files = [
                write_file_durable(tmp / DIFF_FILE, buffer.numpy().data),
                write_file_durable(tmp / OPTIMIZER_FILE, blob.getbuffer()),
            ]
            metadata = {
                "shard_id": shard_id,
                "step": step,
                "base_step": base.step,
                "tensors": {name: _spec(params[name]) for name in params},
                "checksum": DEFAULT_CHECKSUM,
                "checksums": digests,
                "diff_index": index,
            }
            commit_dir(tmp, final, files=files, marker_name=MARKER, metadata=metadata)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune(shard_dir)
        return SnapshotInfo(shard_id, step, base.step, final, len(changed), total)

    @staticmethod
    def _check_snapshot_input(
        step: int, params: Mapping[str, torch.Tensor], base: BaseShard
    ) -> None:
        if not isinstance(step, int) or step < 0:
            raise ShardInputError(f"step must be a non-negative int, got {step!r}")
        if step < base.step:
            raise ShardInputError(
                f"step {step} is older than the base checkpoint's step {base.step}"
            )
        if set(params) != set(base.params):
            raise ShardInputError(
                f"params and base differ in tensors: only in params {sorted(set(params) - set(base.params))}, "
                f"only in base {sorted(set(base.params) - set(params))}"
            )
        for name, tensor in params.items():
            old = base.params[name]
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                raise ShardInputError(f"parameter {name!r} must be a CPU tensor")
            if tensor.dtype != old.dtype or tensor.shape != old.shape:
                raise ShardInputError(
                    f"parameter {name!r} is {_spec(tensor)}, base checkpoint has {_spec(old)}"
                )

    @staticmethod
    def _sweep_tmp(shard_dir: Path) -> None:
        # A writer killed mid-snapshot leaves a temp dir; the single writer per shard removes it.
        for leftover in shard_dir.glob(f"{TMP_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _prune(self, shard_dir: Path) -> None:
        for old in self._candidates(shard_dir.name)[self.keep :]:
            # A writer killed mid-delete then leaves a temp directory that the next writer
            # sweeps, never a snapshot directory whose marker is already gone.
            remove_dir(old.path)

    # ---- reading -------------------------------------------------------------------------

    def _candidates(self, shard_id: str) -> list[SnapshotInfo]:
        """Snapshots whose marker is present and self-consistent, newest first.

        Only the marker is checked here (cheap); file checksums are verified before use.
        """
        shard_dir = self._shard_dir(shard_id)
        if not shard_dir.is_dir():
            return []
        found: list[SnapshotInfo] = []
        for path in sorted(shard_dir.iterdir(), reverse=True):
            if not _SNAP_DIR.fullmatch(path.name):
                continue
            try:
                body = read_marker(path, MARKER)
                meta = body["metadata"]
                info = SnapshotInfo(
                    shard_id,
                    int(meta["step"]),
                    int(meta["base_step"]),
                    path,
                    len(meta["diff_index"]),
                    int(body["files"][DIFF_FILE]["size"]),
                )
            except (CheckpointCorrupt, KeyError, TypeError, ValueError) as exc:
                log.warning(
                    "skipping snapshot without a valid marker",
                    extra={"path": str(path), "error": str(exc)},
                )
                continue
            found.append(info)
        return found

    def latest(self, shard_id: str, *, base_step: int | None = None) -> SnapshotInfo | None:
        """The newest snapshot whose marker and file checksums verify (against ``base_step``)."""
        for info in self._candidates(shard_id):
            if base_step is not None and info.base_step != base_step:
                continue
            try:
                verify_committed_dir(info.path, MARKER)
            except CheckpointCorrupt as exc:
                log.warning(
                    "skipping corrupt snapshot", extra={"path": str(info.path), "error": str(exc)}
                )
                continue
            return info
        return None

    # ---- state and rebuild ---------------------------------------------------------------

    def mark_stale(self, shard_id: str) -> None:
        """The shard lost its state: it gets no new rollouts until rebuilt."""
        self._shard_dir(shard_id)
        with self._lock:
            self._state[shard_id] = STALE
        log.info("shard marked stale", extra={"shard_id": shard_id})

    def is_live(self, shard_id: str) -> bool:
        """False while the shard is stale (marked, or being rebuilt)."""
        with self._lock:
            return self._state.get(shard_id, LIVE) == LIVE

    def rebuild_shard(self, shard_id: str, *, load_base: BaseLoader | None = None) -> RebuiltShard:
        """Mark ``shard_id`` stale, rebuild it from ``load_base(shard_id)`` + its latest snapshot,
        verify the result's checksums, mark it live and count the rebuild.

        ``load_base`` (or the one given to the constructor) returns the shard as of the latest
        full checkpoint; keeping it a callable keeps this module independent of the checkpoint
        engine's file layout.

        The base's tensors are modified in place (the loader should hand over fresh tensors).
        A snapshot whose result fails its checksums is skipped for the next older one (the base
        is loaded again); if every snapshot fails, or the base does not fit, the shard stays
        stale and ShardRebuildError says why.
        """
        loader = load_base or self._load_base
        if loader is None:
            raise ShardInputError("rebuild_shard needs load_base (here or in the constructor)")
        load_base = loader
        started = time.monotonic()
        self.mark_stale(shard_id)
        base = self._load(shard_id, load_base)
        params = dict(base.params)
        optimizer_state = dict(base.optimizer_state)
        step, from_snapshot = base.step, False
        failures: list[str] = []
        for snapshot in self._candidates(shard_id):
            if snapshot.base_step != base.step or snapshot.step < base.step:
                continue
            try:
                # The diff is checked through the rebuilt tensors' checksums below, which is one
                # pass fewer over the largest file than hashing it as well.
                body = verify_committed_dir(snapshot.path, MARKER, only={OPTIMIZER_FILE})
                if (snapshot.path / DIFF_FILE).stat().st_size != body["files"][DIFF_FILE]["size"]:
                    raise CheckpointCorrupt(f"{snapshot.path.name}: {DIFF_FILE} has the wrong size")
                optimizer_state = self._apply(snapshot.path, body["metadata"], params)
            except (CheckpointCorrupt, FileNotFoundError, _ResultMismatch) as exc:
                log.warning(
                    "skipping snapshot", extra={"path": str(snapshot.path), "error": str(exc)}
                )
                failures.append(f"{snapshot.path.name}: {exc}")
                if isinstance(exc, _ResultMismatch):
                    base = self._load(shard_id, load_base)  # the failed attempt changed the tensors
                    params, optimizer_state = dict(base.params), dict(base.optimizer_state)
                continue
            step, from_snapshot = snapshot.step, True
            break
        if failures and not from_snapshot:
            raise ShardRebuildError(
                f"no snapshot of shard {shard_id!r} rebuilds correctly: {'; '.join(failures)}"
            )
        with self._lock:
            self._state[shard_id] = LIVE
            now = self._clock()
            self._rebuilds.append(now)
            self._trim(now)
        seconds = time.monotonic() - started
        log.info("shard rebuilt", extra={"shard_id": shard_id, "step": step, "seconds": seconds})
        return RebuiltShard(shard_id, step, params, optimizer_state, from_snapshot, seconds)

    @staticmethod
    def _load(shard_id: str, load_base: BaseLoader) -> BaseShard:
        try:
            return load_base(shard_id)
        except (RecoveryError, OSError) as exc:
            raise ShardRebuildError(
                f"could not load the base checkpoint of shard {shard_id!r}: {exc}"
            ) from exc

    @staticmethod
    def _apply(
        path: Path, meta: Mapping[str, Any], params: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        for name, (dtype, shape) in meta["tensors"].items():
            have = params.get(name)
            if have is None or _spec(have) != [dtype, shape]:
                raise ShardRebuildError(
                    f"base checkpoint tensor {name!r} is {None if have is None else _spec(have)}, "
                    f"snapshot expects {[dtype, shape]}"
                )
        if set(params) != set(meta["tensors"]):
            raise ShardRebuildError(
                f"base has extra tensors {sorted(set(params) - set(meta['tensors']))}"
            )
        try:
            digest_of = checksum_function(str(meta.get("checksum", "crc32")))
        except TransferConfigError as exc:
            raise ShardRebuildError(str(exc)) from exc
        diff = torch.from_numpy(np.fromfile(path / DIFF_FILE, dtype=np.uint8))
        for entry in meta["diff_index"]:
            target = params[entry["name"]]
            if not target.is_contiguous():
                target = params[entry["name"]] = target.contiguous()
            bits = _bits(target)
            piece = diff[entry["offset"] : entry["offset"] + entry["nbytes"]]
            if len(piece) != entry["nbytes"]:
                raise _ResultMismatch(f"{DIFF_FILE} is shorter than its index says")
            bits.bitwise_xor_(piece.view(bits.dtype))
        for name, expected in meta["checksums"].items():
            actual = _digest(params[name], digest_of)
            if actual != expected:
                raise _ResultMismatch(
                    f"rebuilt tensor {name!r} has checksum {actual:#010x}, snapshot recorded {expected:#010x}"
                )
        state: dict[str, Any] = torch.load(path / OPTIMIZER_FILE, weights_only=True)
        return state

    # ---- the metric ----------------------------------------------------------------------

    def _trim(self, now: float) -> None:
        while self._rebuilds and self._rebuilds[0] < now - REBUILD_WINDOW_S:
            self._rebuilds.popleft()

    def rebuild_timestamps(self, *, now: float | None = None) -> list[float]:
        """Wall-clock times of the rebuilds in the last 5 minutes (oldest first)."""
        with self._lock:
            current = self._clock() if now is None else now
            return [t for t in self._rebuilds if current - REBUILD_WINDOW_S <= t <= current]

    def rebuild_count_5m(self, *, now: float | None = None) -> int:
        """``actor_shard_rebuild_count_5m``: rebuilds in the last 5 minutes."""
        return len(self.rebuild_timestamps(now=now))
