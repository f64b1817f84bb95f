"""Data files beside the write-ahead log: written and fsynced before the record naming them."""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path

from recovery.fsio import fsync_directory, write_new_file
from recovery.wal._errors import WALDataError


def checksum_bytes(data: bytes) -> str:
    """The checksum string stored in records: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def checksum_file(path: Path) -> str:
    """``sha256:<hex>`` of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def write_data_file(data_dir: Path, entry_id: str, data: bytes, *, sync: bool) -> Path:
    """Write ``data`` to a new file in ``data_dir`` (file and directory fsynced when ``sync``).

    The name is derived from the entry id plus a random suffix, so a retried append after a
    crash never overwrites a file that an existing record points at.
    """
    stem = hashlib.sha256(entry_id.encode()).hexdigest()[:24]
    path = data_dir / f"{stem}-{secrets.token_hex(4)}.bin"
    write_new_file(path, data, sync=sync)
    if sync:
        fsync_directory(data_dir)
    return path


def read_verified(path: Path, checksum: str, entry_id: str) -> bytes:
    """The content of ``path`` if it matches ``checksum``, else :class:`WALDataError`."""
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise WALDataError(f"entry {entry_id!r}: cannot read {path}: {exc}") from exc
    actual = checksum_bytes(content)
    if actual != checksum:
        raise WALDataError(f"entry {entry_id!r}: {path} has checksum {actual}, log says {checksum}")
    return content


def unreferenced_data_files(
    data_dir: Path, referenced: set[Path | None], grace_s: float
) -> list[Path]:
    """Files in ``data_dir`` that no entry names and that are older than ``grace_s`` seconds."""
    cutoff = time.time() - grace_s
    return [
        path
        for path in data_dir.iterdir()
        if path not in referenced and path.stat().st_mtime < cutoff
    ]
