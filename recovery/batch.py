"""Atomic commit of rollout batches: a reader sees a whole batch or no batch.

A batch is written into a temporary directory on the same filesystem (``samples.jsonl`` and
``meta.json``, each fsynced), renamed into place as ``<root>/<batch_id>/``, and only then
marked with an empty ``SUCCESS`` file (fsynced, directory fsynced). Readers take only batches
with the marker whose samples match the count and SHA-256 that ``meta.json`` records, so a
worker killed at any point leaves either a complete batch or debris that
:func:`cleanup_uncommitted` removes. Committing the same batch twice is a no-op; committing a
different batch under an existing id is refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery._process_lock import ProcessLock
from recovery.errors import RecoveryError, RecoveryTimeout
from recovery.fsio import fsync_directory, write_new_file
from recovery.pids import process_exists

__all__ = [
    "BatchConflictError",
    "BatchError",
    "BatchLockTimeout",
    "CommittedBatch",
    "cleanup_uncommitted",
    "commit_batch",
    "committed_batches",
]

logger = logging.getLogger("rlguard.recovery.batch")

SAMPLES_FILE = "samples.jsonl"
META_FILE = "meta.json"
SUCCESS_FILE = "SUCCESS"
_LOCK_FILE = ".commit.lock"
_TMP_PREFIX = ".tmp-"
_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_RESERVED_META = frozenset({"batch_id", "timestamp", "complete", "sample_count", "samples_sha256"})


class BatchError(RecoveryError):
    """A batch could not be committed or read; the bad value is named in the message."""


class BatchConflictError(BatchError):
    """A different batch was already committed under this id."""


class BatchLockTimeout(BatchError, RecoveryTimeout):
    """The root's commit lock was not free within ``timeout``."""


@dataclass(frozen=True)
class CommittedBatch:
    """A batch that was completely committed: its directory and its ``meta.json``."""

    batch_id: str
    path: Path
    meta: dict[str, Any]

    def load_samples(self) -> list[dict[str, Any]]:
        """The batch's samples, after checking them against ``meta.json`` once more."""
        content = (self.path / SAMPLES_FILE).read_bytes()
        problem = _content_problem(content, self.meta)
        if problem is not None:
            raise BatchError(f"batch {self.batch_id!r} at {self.path}: {problem}")
        return [json.loads(line) for line in content.splitlines()]


def commit_batch(
    root: str | os.PathLike[str],
    batch_id: str,
    samples: Iterable[Mapping[str, Any]],
    *,
    meta: Mapping[str, Any],
    timeout: float = 30.0,
) -> Path:
    """Commit ``samples`` as batch ``batch_id`` under ``root`` and return its directory.

    ``meta`` must hold ``worker_id`` (non-empty str), ``seed`` (int) and ``token_count``
    (int >= 0), plus any other JSON values; ``timestamp``, ``complete``, ``sample_count`` and
    ``samples_sha256`` are added here. Returns only after the batch and its ``SUCCESS`` marker
    are durable. Raises :class:`BatchError` (writing nothing) for bad input and
    :class:`BatchConflictError` if ``batch_id`` is already committed with other content.
    """
    root_path = Path(root)
    _check_batch_id(batch_id)
    content, count = _serialize_samples(batch_id, samples)
    user_meta = _check_meta(batch_id, meta)
    digest = hashlib.sha256(content).hexdigest()
    full_meta = {
        **user_meta,
        "batch_id": batch_id,
        "timestamp": time.time(),
        "complete": True,
        "sample_count": count,
        "samples_sha256": digest,
    }
    final = root_path / batch_id
    try:
        root_path.mkdir(parents=True, exist_ok=True)
        existing = _existing_commit(final, batch_id, digest, user_meta)
        if existing is not None:
            return existing
        _commit_new(root_path, final, batch_id, content, full_meta, digest, user_meta, timeout)
    except OSError as exc:
        raise BatchError(f"cannot commit batch {batch_id!r} under {root_path}: {exc}") from exc
    logger.info("committed batch %s: %d samples", batch_id, count)
    return final


def _commit_new(
    root: Path,
    final: Path,
    batch_id: str,
    content: bytes,
    full_meta: Mapping[str, Any],
    digest: str,
    user_meta: Mapping[str, Any],
    timeout: float,
) -> None:
    """Write the batch into a temp dir, then rename it in and mark it under the root lock."""
    host = socket.gethostname()
    temp = root / f"{_TMP_PREFIX}{batch_id}.{host}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        temp.mkdir()
        write_new_file(temp / SAMPLES_FILE, content)
        write_new_file(temp / META_FILE, json.dumps(full_meta, sort_keys=True).encode())
        fsync_directory(temp)
        lock = ProcessLock(root / _LOCK_FILE, timeout_error=BatchLockTimeout)
        try:
            lock.acquire(timeout)
            try:
                if _existing_commit(final, batch_id, digest, user_meta) is not None:
                    return
                if final.exists():
                    # Renamed in by a committer that died before writing SUCCESS: never read.
                    logger.warning("batch %s: replacing unmarked leftover %s", batch_id, final)
                    shutil.rmtree(final)
                os.rename(temp, final)
                fsync_directory(root)
                write_new_file(final / SUCCESS_FILE, b"")
                fsync_directory(final)
            finally:
                lock.release()
        finally:
            lock.close()
    finally:
        if temp.exists():
            shutil.rmtree(temp, ignore_errors=True)


def committed_batches(root: str | os.PathLike[str]) -> Iterator[CommittedBatch]:
    """Yield, sorted by id, every batch under ``root`` that is complete and intact.

    A batch without ``SUCCESS`` is skipped silently (it is being written or was abandoned);
    one with the marker whose files do not match its meta is skipped with a warning.
    """
    root_path = Path(root)
    if not root_path.is_dir():
        return
    for name in sorted(os.listdir(root_path)):
        path = root_path / name
        if name.startswith(".") or not (path / SUCCESS_FILE).is_file():
            continue
        try:
            meta = json.loads((path / META_FILE).read_bytes())
            content = (path / SAMPLES_FILE).read_bytes()
        except (OSError, ValueError) as exc:
            logger.warning("batch %s: unreadable despite SUCCESS marker: %s", name, exc)
            continue
        problem = (
            "meta.json is not an object"
            if not isinstance(meta, dict)
            else _content_problem(content, meta)
        )
        if problem is not None:
            logger.warning("batch %s: skipped, %s", name, problem)
            continue
        yield CommittedBatch(batch_id=name, path=path, meta=meta)


def cleanup_uncommitted(root: str | os.PathLike[str], *, timeout: float = 30.0) -> list[Path]:
    """Remove what killed committers left under ``root``; return the removed paths.

    Temporary directories of committers that are still running on this host are kept, so
    this is safe to call while other workers commit.
    """
    root_path = Path(root)
    if not root_path.is_dir():
        return []
    removed: list[Path] = []
    lock = ProcessLock(root_path / _LOCK_FILE, timeout_error=BatchLockTimeout)
    try:
        lock.acquire(timeout)
        try:
            for name in sorted(os.listdir(root_path)):
                path = root_path / name
                if name == _LOCK_FILE or not path.is_dir():
                    continue
                if name.startswith(_TMP_PREFIX):
                    if _writer_alive(name):
                        continue
                elif (path / SUCCESS_FILE).is_file() or name.startswith("."):
                    continue
                shutil.rmtree(path)
                removed.append(path)
            if removed:
                fsync_directory(root_path)
        finally:
            lock.release()
    finally:
        lock.close()
    for path in removed:
        logger.info("removed uncommitted batch debris %s", path)
    return removed


def _writer_alive(temp_name: str) -> bool:
    """True if the temp directory belongs to a live process on this host."""
    parts = temp_name.rsplit(".", 3)
    if len(parts) != 4 or parts[1] != socket.gethostname():
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    return process_exists(pid)


def _check_batch_id(batch_id: object) -> None:
    if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
        raise BatchError(
            f"batch_id {batch_id!r} is not a valid name "
            "(letters, digits, '.', '_', '-'; must start with a letter or digit; <= 200 chars)"
        )


def _serialize_samples(batch_id: str, samples: Iterable[Mapping[str, Any]]) -> tuple[bytes, int]:
    if isinstance(samples, str | bytes | Mapping):
        raise BatchError(
            f"batch {batch_id!r}: samples must be a list of objects, got {type(samples).__name__}"
        )
    lines: list[bytes] = []
    for index, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise BatchError(
                f"batch {batch_id!r}: sample {index} is {type(sample).__name__}, not an object"
            )
        try:
            lines.append(json.dumps(dict(sample), sort_keys=True, allow_nan=False).encode() + b"\n")
        except (TypeError, ValueError) as exc:
            raise BatchError(
                f"batch {batch_id!r}: sample {index} is not JSON-serializable: {exc}"
            ) from exc
    if not lines:
        raise BatchError(f"batch {batch_id!r}: samples must not be empty")
    return b"".join(lines), len(lines)


def _check_meta(batch_id: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(meta, Mapping):
        raise BatchError(f"batch {batch_id!r}: meta must be a mapping, got {type(meta).__name__}")
    reserved = sorted(_RESERVED_META & set(meta))
    if reserved:
        raise BatchError(f"batch {batch_id!r}: meta keys {reserved} are set by commit_batch")
    worker_id = meta.get("worker_id")
    if not isinstance(worker_id, str) or not worker_id.strip():
        raise BatchError(
            f"batch {batch_id!r}: meta worker_id must be a non-empty string, got {worker_id!r}"
        )
    seed = meta.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise BatchError(f"batch {batch_id!r}: meta seed must be an int, got {seed!r}")
    tokens = meta.get("token_count")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise BatchError(
            f"batch {batch_id!r}: meta token_count must be an int >= 0, got {tokens!r}"
        )
    try:
        # Round-trip so tuples become lists and the idempotency check compares like with like.
        normalized: dict[str, Any] = json.loads(json.dumps(dict(meta), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise BatchError(f"batch {batch_id!r}: meta is not JSON-serializable: {exc}") from exc
    return normalized


def _content_problem(content: bytes, meta: Mapping[str, Any]) -> str | None:
    if meta.get("complete") is not True:
        return "meta.json does not say complete"
    digest = hashlib.sha256(content).hexdigest()
    if digest != meta.get("samples_sha256"):
        return f"samples.jsonl has sha256 {digest}, meta.json says {meta.get('samples_sha256')}"
    count = content.count(b"\n")
    if count != meta.get("sample_count"):
        return f"samples.jsonl has {count} samples, meta.json says {meta.get('sample_count')}"
    return None


def _existing_commit(
    final: Path, batch_id: str, digest: str, user_meta: Mapping[str, Any]
) -> Path | None:
    """The committed batch if it is this very batch; None if absent; conflict otherwise."""
    if not (final / SUCCESS_FILE).is_file():
        return None
    try:
        meta = json.loads((final / META_FILE).read_bytes())
    except (OSError, ValueError) as exc:
        raise BatchError(
            f"batch {batch_id!r} is marked committed but its meta.json is unreadable: {exc}"
        ) from exc
    same_meta = all(meta.get(k) == v for k, v in user_meta.items())
    if meta.get("samples_sha256") != digest or not same_meta:
        raise BatchConflictError(
            f"batch {batch_id!r} is already committed at {final} with different content "
            f"(samples sha256 {meta.get('samples_sha256')}, new {digest})"
        )
    return final
