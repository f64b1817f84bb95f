"""Durable file-system steps shared by every writer of the recovery library (and the agent and
workload beside it): one way to replace a small file, one way to make a directory durable.

Replacing a file: write a new temporary file in the same directory, ``fsync`` it, ``rename`` it
over the target, ``fsync`` the directory so that the rename itself survives a power loss. A
reader (or a crash at any moment) sees the old content or the new one, never a mix; with
``sync=False`` the two fsyncs are skipped (the file still survives a killed process, not a
power loss) for advisory files rewritten often, such as heartbeats.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Names of temporary files and directories start with this, so that sweeps and readers that
#: look for final names (``*.json``, a marker) never take one for a finished file.
TMP_PREFIX = ".tmp-"


def fsync_directory(path: Path) -> None:
    """Make the directory's entries (created, renamed, removed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Make the content of a file someone else wrote durable."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Create ``path`` (it must not exist), write ``data`` and fsync it when ``sync``.

    A failure removes the partly written file before raising.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def replace_file(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: temporary file → fsync → rename → fsync of
    the directory (no fsync at all with ``sync=False``). The directory must exist.

    The temporary name is unique (``.tmp-<name>-<random>``), so concurrent writers and the
    leftover of a killed one never collide; a failure removes it before raising ``OSError``.
    """
    temp = path.with_name(f"{TMP_PREFIX}{path.name}-{secrets.token_hex(4)}")
    write_new_file(temp, data, sync=sync)
    try:
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_directory(path.parent)


def write_json_atomic(path: Path, payload: Mapping[str, Any], *, sync: bool = True) -> None:
    """Replace ``path`` with ``payload`` as indented, key-sorted JSON (:func:`replace_file`).

    NaN and infinities are refused (``ValueError``): not every JSON reader accepts them.
    """
    encoded = json.dumps(payload, sort_keys=True, indent=1, allow_nan=False).encode()
    replace_file(path, encoded, sync=sync)
