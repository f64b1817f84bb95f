"""The layout of a checkpoint root on disk: ``ckpt-<seq>/`` directories holding the layer files,
``manifest.json`` and the ``COMMITTED`` marker; listing them, applying retention and mirroring
(reading the files back is :mod:`recovery.checkpoint._read`)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointCorrupt

MARKER = "COMMITTED"
MANIFEST = "manifest.json"
_DIR_RE = re.compile(r"^ckpt-(\d{10})$")


def stat_key(path: Path) -> tuple[int, int, int]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return (-1, -1, -1)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def list_dirs(root: Path) -> list[tuple[int, Path]]:
    out = []
    for path in root.iterdir():
        m = _DIR_RE.fullmatch(path.name)
        if m and path.is_dir():
            out.append((int(m.group(1)), path))
    return out


def apply_retention(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` committed checkpoints; drop older ones and unmarked leftovers."""
    dirs = sorted(list_dirs(root), reverse=True)
    kept = 0
    for _seq, path in dirs:
        committed = (path / MARKER).exists()
        if committed and kept < keep:
            kept += 1
            continue
        if not committed and kept == 0:
            continue  # newer than every committed one: leave it for latest() to report
        atomic.remove_dir(path)  # never a half-deleted directory under a checkpoint name


def mirror_committed(local: Path, mirror_root: Path, body: Mapping[str, Any]) -> None:
    """Copy the committed checkpoint ``local`` (its marker ``body``) into ``mirror_root`` and
    commit it there the same way; a file that no longer matches its checksum is not mirrored."""
    target = mirror_root / local.name
    tmp = atomic.make_tmp_dir(mirror_root, local.name)
    try:
        digests = []
        for name, expected in sorted(body["files"].items()):
            algorithm, _ = atomic.expected_checksum(expected)
            digest = atomic.copy_file_durable(local / name, tmp / name, checksum=algorithm)
            if not digest.matches(expected):
                raise CheckpointCorrupt(f"{local.name}/{name} changed after commit; not mirrored")
            digests.append(digest)
        atomic.commit_dir(tmp, target, files=digests, marker_name=MARKER, metadata=body["metadata"])
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
