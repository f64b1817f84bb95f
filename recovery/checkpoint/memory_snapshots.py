"""Every-step snapshots in host shared memory (``/dev/shm``), in the checkpoint engine's format.

A training process copies its state into a directory of a ``tmpfs`` that another process owns
(the launcher, which outlives the trainer, persists the snapshots to disk in the background with
:class:`recovery.checkpoint.persister.SnapshotPersister` and removes the segment when the job
ends; :mod:`recovery.checkpoint.segment_owner`). The trainer blocks for the copy and the
checksum, nothing else.

A snapshot directory is laid out exactly like one of
:class:`~recovery.checkpoint.engine.CheckpointEngine` (``ckpt-<seq>/``, ``COMMITTED`` marker
last), so :class:`~recovery.checkpoint.reader.CheckpointReader` reads memory, the persisted
copies and the engine's own checkpoints alike, and passes over a torn one with its reason. The
writer keeps ``keep`` (default 2) committed snapshots and reuses the oldest one's pages for the
next (marker removed first, ``core.bin`` overwritten in place through ``mmap``): a kill at any
moment leaves the newest committed snapshot untouched and, at worst, a temporary directory the
next writer sweeps.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from recovery._process_lock import ProcessLock
from recovery.checkpoint import _serialize, atomic
from recovery.checkpoint.errors import CheckpointError, CheckpointInputError
from recovery.checkpoint.layout import MANIFEST, MARKER, list_dirs
from recovery.checkpoint.version import VersionVector, WeightVersionTable
from recovery.errors import RecoveryTimeout
from recovery.fsio import TMP_PREFIX

log = logging.getLogger("rlguard.recovery.checkpoint.memory")

CORE_FILE = "core.bin"
CHECKSUM = "crc32c"


class SnapshotSpaceError(CheckpointError):
    """The shared-memory filesystem cannot hold the snapshots; the message names the sizes."""


@dataclass(frozen=True)
class SnapshotSaved:
    """One committed memory snapshot and what it cost the caller."""

    seq: int
    path: Path
    nbytes: int
    copy_seconds: float  # the memory copy alone
    blocking_seconds: float  # everything the caller waited for (copy, checksum, marker)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still allocate on ``path``'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


class MemorySnapshotWriter:
    """Writes snapshots of a state into ``root`` (a directory on ``/dev/shm``).

    ``keep``: committed snapshots kept (>= 2 so the newest survives the writing of the next).
    ``limit_bytes``: at most this much for all of them (None: what the filesystem has free).
    ``seq_after``: other roots whose ``ckpt-<seq>`` names the new seqs must not reuse (the
    directory the snapshots are persisted to). ``after_copy``: called with the seq after the
    copy and before the checksum and marker (a test's fault injector: a kill there must leave a
    snapshot that is never resumed from).
    """

    def __init__(
        self,
        root: Path,
        *,
        keep: int = 2,
        limit_bytes: int | None = None,
        seq_after: Iterable[Path] = (),
        after_copy: Callable[[int], None] | None = None,
        lock_timeout: float = 10.0,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 2:
            raise CheckpointInputError(f"keep must be an int >= 2, got {keep!r}")
        if limit_bytes is not None and (isinstance(limit_bytes, bool) or limit_bytes < 0):
            raise CheckpointInputError(f"limit_bytes must be >= 0, got {limit_bytes!r}")
        self.root = Path(root)
        self.keep = keep
        self.limit_bytes = limit_bytes
        self.seq_after = [Path(p) for p in seq_after]
        self.after_copy = after_copy
        self.lock_timeout = lock_timeout
        self._lock: ProcessLock | None = None
        self._next_seq: int | None = None

    # ---- space -------------------------------------------------------------------------------

    def check_space(self, nbytes: int) -> None:
        """Raise :class:`SnapshotSpaceError` unless ``keep`` snapshots of ``nbytes`` fit.

        The snapshots this writer already holds count as available: their pages are reused."""
        self.root.mkdir(parents=True, exist_ok=True)
        needed = self.keep * nbytes
        held = sum(_dir_bytes(p) for _, p in list_dirs(self.root))
        available = free_bytes(self.root) + held
        where = f"{self.root} ({available:,} bytes available)"
        if self.limit_bytes is not None and self.limit_bytes < available:
            available = self.limit_bytes
            where = f"the snapshot limit of {self.limit_bytes:,} bytes for {self.root}"
        if needed > available:
            raise SnapshotSpaceError(
                f"memory snapshots need {self.keep} x {nbytes:,} = {needed:,} bytes, "
                f"more than {where}"
            )

    # ---- writing -----------------------------------------------------------------------------

    def _acquire(self) -> None:
        if self._lock is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        lock = ProcessLock(self.root / ".writer.lock")
        try:
            lock.acquire(self.lock_timeout)
        except RecoveryTimeout:
            lock.close()
            raise RecoveryTimeout(
                f"another process writes snapshots into {self.root} "
                f"(lock held > {self.lock_timeout} s)"
            ) from None
        self._lock = lock
        # The only writer now: a temporary directory is what a killed writer left mid-snapshot.
        for stale in self.root.glob(f"{TMP_PREFIX}*"):
            log.info("removing %s left by an interrupted snapshot", stale)
            shutil.rmtree(stale, ignore_errors=True)
        seqs = [
            s for root in (self.root, *self.seq_after) if root.is_dir() for s, _ in list_dirs(root)
        ]
        self._next_seq = max(seqs, default=0) + 1

    def _workspace(self, seq: int) -> Path:
        """A temporary directory for snapshot ``seq``: the oldest committed snapshot's, once
        ``keep`` of them exist (unmarked first), else a new one."""
        committed = sorted(list_dirs(self.root))
        for _seq, path in committed:
            if not (path / MARKER).exists():
                atomic.remove_dir(path)  # a final name without a marker: never a snapshot
        committed = [(s, p) for s, p in committed if p.exists()]
        if len(committed) < self.keep:
            return atomic.make_tmp_dir(self.root, f"ckpt-{seq:010d}")
        _old, oldest = committed[0]
        (oldest / MARKER).unlink()  # from here on it is not a snapshot
        tmp = self.root / f"{TMP_PREFIX}ckpt-{seq:010d}-reused"
        os.rename(oldest, tmp)
        (tmp / MANIFEST).unlink(missing_ok=True)
        return tmp

    def _copy_core(self, path: Path, flat: _serialize.Flattener, seq: int) -> tuple[str, float]:
        """Copy the tensors into ``path`` (reused in place when it has the right size); returns
        the CRC-32C of the bytes and the seconds the copy took."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != flat.size:
                os.ftruncate(fd, flat.size)
            started = time.perf_counter()
            hasher = atomic.new_hasher(CHECKSUM)
            if flat.size:
                with mmap.mmap(fd, flat.size) as mapped:
                    target = torch.frombuffer(mapped, dtype=torch.uint8)
                    _serialize.copy_into(target, flat.tensors, flat.slots)
                    del target  # releases the export of ``mapped`` so it can close
                    copied = time.perf_counter() - started
                    if self.after_copy is not None:
                        self.after_copy(seq)
                    with memoryview(mapped) as view:
                        hasher.update(view)
            else:
                copied = time.perf_counter() - started
                if self.after_copy is not None:
                    self.after_copy(seq)
        finally:
            os.close(fd)
        return hasher.hexdigest(), copied

    def save(
        self,
        state: Mapping[str, Any],
        *,
        version: VersionVector,
        metadata: Mapping[str, Any] | None = None,
    ) -> SnapshotSaved:
        """Commit a snapshot of ``state`` (component name -> value, as for the engine; every
        component in the ``core`` layer). Raises :class:`SnapshotSpaceError` (nothing written)
        when it does not fit, ``OSError`` when the filesystem refuses; the newest snapshot
        committed before stays valid either way."""
        started = time.perf_counter()
        if not isinstance(version, VersionVector):
            raise CheckpointInputError(f"version must be a VersionVector, got {version!r}")
        if not isinstance(state, Mapping) or not state:
            raise CheckpointInputError(f"state must be a non-empty mapping, got {state!r:.80}")
        flat = _serialize.Flattener()
        skeletons = {
            name: {"layer": "core", "value": flat.encode(value, name)}
            for name, value in state.items()
        }
        manifest = json.dumps(
            {"components": skeletons, "slots": {"core": [s.as_json() for s in flat.slots]}},
            separators=(",", ":"),
            allow_nan=False,
        ).encode()
        self.check_space(flat.size + len(manifest))
        self._acquire()
        assert self._next_seq is not None
        seq = self._next_seq
        self._next_seq += 1
        tmp = self._workspace(seq)
        crc, copied = self._copy_core(tmp / CORE_FILE, flat, seq)
        files = [
            atomic.FileDigest(CORE_FILE, flat.size, crc, CHECKSUM),
            atomic.write_file_durable(tmp / MANIFEST, manifest, checksum=CHECKSUM),
        ]
        final = self.root / f"ckpt-{seq:010d}"
        atomic.commit_dir(
            tmp,
            final,
            files=files,
            marker_name=MARKER,
            metadata={
                **dict(metadata or {}),
                "kind": "memory_snapshot",
                "seq": seq,
                "version": version.as_json(),
                "weight_versions": WeightVersionTable().as_json(),
                "layers": {"core": list(state)},
                "transient": [],
                "created_at": time.time(),
            },
        )
        return SnapshotSaved(
            seq, final, flat.size + len(manifest), copied, time.perf_counter() - started
        )

    def close(self) -> None:
        """Release the writer lock (the snapshots stay)."""
        if self._lock is not None:
            self._lock.release()
            self._lock.close()
            self._lock = None
