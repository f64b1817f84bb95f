"""Crash-safe directory commits: temporary files → fsync → checksums → rename → marker.

The recipe every durable artefact of the library follows (checkpoints here, shard snapshots in
``recovery/shards.py``):

1. write every file into a private temporary directory beside the final one,
2. ``fsync`` each file (the SHA-256 is computed while the kernel flushes, so hashing is nearly
   free) and then the temporary directory itself,
3. ``rename`` the directory to its final name and ``fsync`` the parent, so the name is durable,
4. write the completion marker (sizes and SHA-256 of every file plus the caller's metadata, with a
   checksum of the marker itself) through its own temp → fsync → rename.

A reader trusts a directory only when :func:`verify_committed_dir` accepts it. A writer killed at
any moment leaves either a ``.tmp-*`` directory, a final directory without a marker, or a complete
one; never a directory that verifies but holds partial data.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError, CheckpointWriteError

MARKER_FORMAT = 1
TMP_PREFIX = ".tmp-"
_CHUNK = 8 << 20
_PARALLEL_HASH_MIN = 1 << 20


@dataclass(frozen=True)
class FileDigest:
    """Size in bytes and SHA-256 (hex) of one committed file."""

    name: str
    size: int
    sha256: str

    def as_json(self) -> dict[str, Any]:
        """The marker's representation of this digest."""
        return {"size": self.size, "sha256": self.sha256}


def fsync_dir(path: Path) -> None:
    """Make the directory entry changes inside ``path`` (creates, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_tmp_dir(parent: Path, label: str) -> Path:
    """Create a fresh private temporary directory in ``parent`` (same filesystem as the target)."""
    tmp = parent / f"{TMP_PREFIX}{label}-{uuid.uuid4().hex[:12]}"
    tmp.mkdir(parents=False, exist_ok=False)
    return tmp


def write_file_durable(
    path: Path, data: memoryview | bytes, *, chunk_size: int = _CHUNK
) -> FileDigest:
    """Write ``data`` to a new file ``path``, fsync it and return its size and SHA-256.

    The digest is taken from the in-memory bytes by a second thread that runs while this one
    writes and fsyncs (hashlib and the syscalls release the GIL), so on anything but tiny files
    integrity costs no extra wall time.
    """
    view = memoryview(data).cast("B")
    digest = hashlib.sha256()
    hash_error: list[BaseException] = []

    def hash_all() -> None:
        try:
            for start in range(0, len(view), chunk_size):
                digest.update(view[start : start + chunk_size])
        except BaseException as exc:  # re-raised in the caller's thread below
            hash_error.append(exc)

    hasher: threading.Thread | None = None
    if len(view) >= _PARALLEL_HASH_MIN:
        hasher = threading.Thread(target=hash_all, name="rlguard-ckpt-hash", daemon=True)
        hasher.start()
    else:
        hash_all()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for start in range(0, len(view), chunk_size):
                chunk = view[start : start + chunk_size]
                written = 0
                while written < len(chunk):
                    written += os.write(fd, chunk[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        if hasher is not None:
            hasher.join()
    if hash_error:
        raise CheckpointWriteError(f"hashing {path} failed: {hash_error[0]!r}") from hash_error[0]
    return FileDigest(name=path.name, size=len(view), sha256=digest.hexdigest())


def digest_file(path: Path, *, chunk_size: int = _CHUNK) -> FileDigest:
    """Read ``path`` and return its size and SHA-256 (used to verify and to mirror)."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk_size):
            digest.update(block)
            size += len(block)
    return FileDigest(name=path.name, size=size, sha256=digest.hexdigest())


def copy_file_durable(src: Path, dst: Path, *, chunk_size: int = _CHUNK) -> FileDigest:
    """Stream ``src`` into a new file ``dst``, fsync it and return the digest of what was read."""
    digest = hashlib.sha256()
    size = 0
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with open(src, "rb") as fh:
            while block := fh.read(chunk_size):
                digest.update(block)
                view = memoryview(block)
                written = 0
                while written < len(view):
                    written += os.write(fd, view[written:])
                size += len(block)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FileDigest(name=dst.name, size=size, sha256=digest.hexdigest())


def _marker_body_digest(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``payload`` as JSON via temp → fsync → rename → fsync(parent)."""
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}")
    encoded = json.dumps(payload, sort_keys=True, indent=1, allow_nan=False).encode()
    write_file_durable(tmp, encoded)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def commit_dir(
    tmp_dir: Path,
    final_dir: Path,
    *,
    files: list[FileDigest],
    marker_name: str,
    metadata: Mapping[str, Any],
) -> dict[str, Any]:
    """Publish ``tmp_dir`` as ``final_dir`` and write its completion marker; returns the marker.

    ``files`` are the digests returned by :func:`write_file_durable` for everything inside
    ``tmp_dir``. ``final_dir`` must not exist: committing never overwrites a previous artefact.
    """
    if final_dir.exists():
        raise CheckpointInputError(f"refusing to overwrite existing directory {final_dir}")
    names = sorted(p.name for p in tmp_dir.iterdir())
    listed = sorted(f.name for f in files)
    if names != listed:
        raise CheckpointInputError(
            f"files in {tmp_dir} {names} differ from the digests given {listed}"
        )
    fsync_dir(tmp_dir)
    os.rename(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)
    body: dict[str, Any] = {
        "format": MARKER_FORMAT,
        "files": {f.name: f.as_json() for f in files},
        "metadata": dict(metadata),
    }
    marker = {"body": body, "body_sha256": _marker_body_digest(body)}
    write_json_atomic(final_dir / marker_name, marker)
    return body


def read_marker(final_dir: Path, marker_name: str) -> dict[str, Any]:
    """Parse and self-check the marker of ``final_dir``; raises :class:`CheckpointCorrupt`."""
    path = final_dir / marker_name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorrupt(f"{final_dir.name}: no {marker_name} marker") from None
    try:
        marker = json.loads(raw)
        body = marker["body"]
        claimed = marker["body_sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(f"{final_dir.name}: unreadable {marker_name}: {exc}") from None
    if not isinstance(body, dict) or _marker_body_digest(body) != claimed:
        raise CheckpointCorrupt(f"{final_dir.name}: {marker_name} fails its own checksum")
    if body.get("format") != MARKER_FORMAT:
        raise CheckpointCorrupt(f"{final_dir.name}: unknown marker format {body.get('format')!r}")
    return body


def verify_committed_dir(
    final_dir: Path, marker_name: str, *, only: set[str] | None = None
) -> dict[str, Any]:
    """Check the marker and the size and SHA-256 of every file it lists (or those in ``only``).

    Returns the marker body; raises :class:`CheckpointCorrupt` naming the first problem found.
    """
    body = read_marker(final_dir, marker_name)
    files: dict[str, Any] = body["files"]
    for name, expected in sorted(files.items()):
        if only is not None and name not in only:
            continue
        path = final_dir / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointCorrupt(f"{final_dir.name}: file {name} is missing") from None
        if size != expected["size"]:
            raise CheckpointCorrupt(
                f"{final_dir.name}: file {name} is {size} bytes, marker says {expected['size']}"
            )
        actual = digest_file(path)
        if actual.sha256 != expected["sha256"]:
            raise CheckpointCorrupt(f"{final_dir.name}: checksum mismatch in {name}")
    return body
