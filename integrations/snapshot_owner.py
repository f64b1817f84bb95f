"""The launcher's side of every-step memory snapshots: it owns the shared memory.

``rlguard launch --integration trl`` creates one segment per job on ``/dev/shm``
(``rlguard-<job>-<hash of the run directory>/``, a ``rank-<r>/`` directory per rank), records
itself as its owner (:func:`recovery.checkpoint.memory_snapshots.write_owner`), tells its
processes where it is (``RLGUARD_SNAPSHOT_SHM``), persists their snapshots to
``<run_dir>/snapshots/rank-<r>/`` in the background
(:class:`recovery.checkpoint.persister.SnapshotPersister`) and removes the segment when the
launch ends. The memory outlives any trainer process, so a restarted trainer resumes from it.

On a restart the integration asks :meth:`SnapshotOwner.newest_step` which snapshot is the newest
committed one (memory first, then disk; a snapshot whose checksums fail is passed over with the
reason logged). This module imports no torch: the launcher stays light.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
from pathlib import Path

from integrations.snapshot_rounds import SnapshotRounds
from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointCorrupt
from recovery.checkpoint.layout import MARKER, list_dirs
from recovery.checkpoint.persister import SnapshotPersister
from recovery.checkpoint.segment_owner import write_owner

log = logging.getLogger("rlguard.launch.snapshots")

ENV_SNAPSHOT_SHM = "RLGUARD_SNAPSHOT_SHM"
DEFAULT_SHM_BASE = Path("/dev/shm")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def rank_dir(root: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its snapshots under ``root`` (a memory segment or disk root)."""
    return root / f"rank-{rank}"


def disk_root(run_dir: Path) -> Path:
    """Where a job's snapshots are persisted on disk."""
    return run_dir / "snapshots"


def segment_path(shm_base: Path, job: str, run_dir: Path) -> Path:
    """The job's memory segment: named by the job and its run directory (two launches of one
    job name in different run directories do not share memory)."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
    return shm_base / f"rlguard-{_SAFE.sub('_', job)}-{digest}"


def newest_verified(root: Path) -> tuple[int, Path] | None:
    """``(training_step, path)`` of the newest snapshot under ``root`` whose marker and every
    file's checksum verify; each one passed over is logged with the reason."""
    try:
        candidates = sorted(list_dirs(root), reverse=True)
    except FileNotFoundError:
        return None
    for _seq, path in candidates:
        try:
            body = atomic.verify_committed_dir(path, MARKER)
            step = int(body["metadata"]["version"]["training_step"])
        except (CheckpointCorrupt, KeyError, TypeError, ValueError, OSError) as exc:
            log.warning("not resuming from snapshot %s: %s", path, exc)
            continue
        return step, path
    return None


class SnapshotOwner:
    """Owns a job's memory segment for the life of one ``rlguard launch``."""

    def __init__(
        self,
        job: str,
        run_dir: Path,
        ranks: list[int],
        *,
        shm_base: Path = DEFAULT_SHM_BASE,
        keep: int = 3,
    ) -> None:
        self.root = segment_path(shm_base, job, run_dir)
        self.disk = disk_root(run_dir)
        self.ranks = list(ranks)
        self.persister = SnapshotPersister(
            [(rank_dir(self.root, r), rank_dir(self.disk, r)) for r in self.ranks], keep=keep
        )
        # Several ranks: a step is committed only when every rank holds its snapshot
        # (integrations.snapshot_rounds); one rank alone commits each of its snapshots.
        self.rounds = SnapshotRounds(run_dir, self.ranks) if len(self.ranks) > 1 else None

    def start(self) -> None:
        """Create the segment (and the run directory), claim it and start persisting."""
        for rank in self.ranks:
            rank_dir(self.root, rank).mkdir(parents=True, exist_ok=True)
        # Here, not by the persister's first write (its snapshots/ below it): the rounds publish
        # into the run directory from the start (a round adopted before the first persist found
        # no directory). snapshots/ itself is left to the persister (it may be unusable: counted).
        self.disk.parent.mkdir(parents=True, exist_ok=True)
        write_owner(self.root, os.getpid())
        self.persister.start()
        if self.rounds is not None:
            self.rounds.start()

    def env(self) -> dict[str, str]:
        """What each supervised process is told."""
        rounds = self.rounds.env() if self.rounds is not None else {}
        return {ENV_SNAPSHOT_SHM: str(self.root), **rounds}

    def resume_step(self) -> int | None:
        """The step every rank restarts from: with several ranks the newest committed step all
        of them hold (:func:`integrations.snapshot_rounds.consistent_step`, adopted as the
        committed one), else rank 0's newest snapshot (:meth:`newest_step`)."""
        if self.rounds is None:
            return self.newest_step()
        step = self.rounds.resume_step([self.root, self.disk])
        if step is not None:
            self.rounds.adopt(step)
        return step

    def newest_step(self, rank: int = 0) -> int | None:
        """The training step of the newest committed snapshot of ``rank``: memory first, then
        disk; None when neither holds one that verifies."""
        found = [
            hit[0]
            for where in (rank_dir(self.root, rank), rank_dir(self.disk, rank))
            if (hit := newest_verified(where)) is not None
        ]
        return max(found, default=None)

    def close(self) -> None:
        """Persist what is left, then free the memory."""
        if self.rounds is not None:
            self.rounds.close()
        self.persister.stop()
        shutil.rmtree(self.root, ignore_errors=True)


_ACTIVE: SnapshotOwner | None = None


def set_active(owner: SnapshotOwner | None) -> None:
    """Make ``owner`` the one this launcher process's integration consults on restarts."""
    global _ACTIVE
    _ACTIVE = owner


def active() -> SnapshotOwner | None:
    """The snapshot owner of this launcher process, if any."""
    return _ACTIVE


def start_for_launch(
    integration: object, job: str, run_dir: Path, ranks: list[int], world_size: int | None = None
) -> SnapshotOwner | None:
    """Start the owner for a launch whose integration takes memory snapshots (its
    ``memory_snapshots`` attribute is true), make it the active one, and return it; None for
    the others, or when the segment cannot be created (logged: the trainers then persist their
    snapshots by themselves). None too for a launch of some ranks of a larger world (one
    ``rlguard launch`` per rank under torchrun): its ranks could not commit a step together, so
    a restart resumes from the Trainer's ``checkpoint-N``, which every rank wrote."""
    if not getattr(integration, "memory_snapshots", False):
        return None
    if world_size is not None and world_size > len(ranks):
        log.warning(
            "memory snapshots off: this launch runs ranks %s of a world of %d; start every rank "
            "with one rlguard launch --nproc %d for snapshots committed across ranks",
            ranks,
            world_size,
            world_size,
        )
        return None
    owner = SnapshotOwner(job, run_dir, ranks)
    try:
        owner.start()
    except OSError as exc:
        log.error("memory snapshots off: cannot create %s: %s", owner.root, exc)
        return None
    set_active(owner)
    return owner
