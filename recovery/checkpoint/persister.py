"""Persisting memory snapshots to disk, in the background, by the process that owns them.

:class:`SnapshotPersister` watches snapshot directories on ``/dev/shm``
(:mod:`recovery.checkpoint.memory_snapshots`) and copies each newly committed snapshot to its
disk root through the checkpoint engine's own commit (:func:`recovery.checkpoint.layout.
mirror_committed`: temporary directory, every file's checksum compared with the marker as it is
copied, fsync, rename, marker), then keeps the newest ``keep`` there. It runs in the owner of
the memory (the launcher), so the trainer never waits for a disk.

The trainer overwrites the oldest memory snapshot while the persister may still be copying it;
a copy whose checksum no longer matches the marker it started from is dropped (a newer snapshot
exists), never committed. A failure of the disk side (full, unwritable) is counted in
``PERSIST_STATUS.json`` beside the snapshots, with the disk root (``dir``) and the error without
file names (``error``), where the trainer reads it and reports it
(``snapshot_persist_errors_total``: incident ``checkpoint_write_errors``); persisting goes on with
the next snapshot.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError
from recovery.checkpoint.layout import MARKER, apply_retention, list_dirs, mirror_committed
from recovery.fsio import write_json_atomic

log = logging.getLogger("rlguard.recovery.checkpoint.persister")

STATUS_FILE = "PERSIST_STATUS.json"


@dataclass
class PersistTarget:
    """One memory snapshot directory and the disk root its snapshots are persisted to."""

    source: Path
    target: Path
    persisted_seq: int = 0
    failed_seq: int = 0
    errors: int = 0
    last_error: str | None = None
    error: str | None = None  # last_error without file names: the same text for every snapshot


def read_status(source: Path) -> dict[str, Any]:
    """What the persister last wrote about ``source`` (``{}`` when nothing yet)."""
    try:
        data = json.loads((source / STATUS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def error_text(exc: BaseException) -> str:
    """``exc`` without the file name an ``OSError`` carries (``[Errno 28] No space left on
    device``): it names a snapshot, and the same fault should read the same for each one."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}" if exc.errno is not None else exc.strerror
    return f"{type(exc).__name__}: {exc}"


class SnapshotPersister:
    """Copies new memory snapshots of every ``(source, target)`` pair to disk, keeping ``keep``.

    ``interval``: how often the sources are looked at (seconds). :meth:`persist_once` does one
    pass in the caller's thread; :meth:`start` runs passes on a daemon thread until
    :meth:`stop`, which does a last pass so the newest snapshot reaches the disk.
    """

    def __init__(
        self, pairs: Sequence[tuple[Path, Path]], *, keep: int = 3, interval: float = 0.05
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise CheckpointInputError(f"keep must be an int >= 1, got {keep!r}")
        if not (isinstance(interval, int | float) and 0 < interval <= 60):
            raise CheckpointInputError(f"interval must be in (0, 60] seconds, got {interval!r}")
        self.targets = [PersistTarget(Path(s), Path(t)) for s, t in pairs]
        self.keep = keep
        self.interval = float(interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Persist in the background from now on."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="rlguard-persist", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the background thread after a last pass (bounded by ``timeout``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.persist_once()
            self._stop.wait(self.interval)
        self.persist_once()

    def persist_once(self) -> list[int]:
        """One pass: persist the newest committed snapshot of each source that is not on disk
        yet. Returns the seqs committed to disk in this pass."""
        done = []
        for entry in self.targets:
            seq = self._persist_newest(entry)
            if seq is not None:
                done.append(seq)
        return done

    def _persist_newest(self, entry: PersistTarget) -> int | None:
        try:
            candidates = sorted(list_dirs(entry.source), reverse=True)
        except FileNotFoundError:
            return None
        for seq, path in candidates:
            if seq <= max(entry.persisted_seq, entry.failed_seq):
                return None
            try:
                body = atomic.read_marker(path, MARKER)
            except (CheckpointCorrupt, OSError):
                continue  # being written or reused by the trainer
            return self._persist(entry, seq, path, body)
        return None

    def _persist(
        self, entry: PersistTarget, seq: int, path: Path, body: dict[str, Any]
    ) -> int | None:
        try:
            entry.target.mkdir(parents=True, exist_ok=True)
            if (entry.target / path.name).exists():
                entry.persisted_seq = seq  # already there (a pass before a restart did it)
                return None
            mirror_committed(path, entry.target, body)
            apply_retention(entry.target, self.keep)
        except CheckpointCorrupt as exc:
            # The trainer reused the memory while we copied it: a newer snapshot exists.
            log.debug("snapshot %s changed while it was persisted: %s", path.name, exc)
            return None
        except OSError as exc:
            if self._source_changed(path, body):
                return None
            entry.failed_seq = seq
            entry.errors += 1
            entry.last_error = f"{path.name} -> {entry.target}: {exc}"
            entry.error = error_text(exc)
            log.error("could not persist memory snapshot %s", entry.last_error)
            self._write_status(entry)
            return None
        entry.persisted_seq = seq
        self._write_status(entry)
        return seq

    @staticmethod
    def _source_changed(path: Path, body: dict[str, Any]) -> bool:
        try:
            return atomic.read_marker(path, MARKER) != body
        except (CheckpointCorrupt, OSError):
            return True

    @staticmethod
    def _write_status(entry: PersistTarget) -> None:
        status = {
            "persisted_seq": entry.persisted_seq,
            "errors": entry.errors,
            "last_error": entry.last_error,
            "dir": str(entry.target),
            "error": entry.error,
            "at": time.time(),
        }
        try:
            write_json_atomic(entry.source / STATUS_FILE, status, sync=False)
        except OSError as exc:  # the memory segment itself is gone: nobody to tell
            log.warning("could not write %s in %s: %s", STATUS_FILE, entry.source, exc)
