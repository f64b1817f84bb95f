"""The one way the recovery library replaces a file: temporary file, fsync, rename, fsync of the
directory; nothing half-written is ever seen under the final name or left behind."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

# White-box: the shared writer behind every public writer of the library (control file,
# checkpoint markers, heartbeats, WAL data files, batches).
from recovery import fsio

pytestmark = pytest.mark.timeout(30)


class _Syncs:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files: list[int] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            self.files.append(fd)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)


def test_replace_file_swaps_content_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")
    syncs = _Syncs(monkeypatch)
    fsio.replace_file(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
    assert len(syncs.files) == 2  # the file before the rename, the directory after it


def test_replace_file_without_sync_never_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = _Syncs(monkeypatch)
    fsio.replace_file(tmp_path / "hb.json", b"{}", sync=False)
    assert (tmp_path / "hb.json").read_bytes() == b"{}"
    assert syncs.files == []


def test_a_failed_rename_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "control.json"
    target.write_bytes(b"old")

    def refuse(src: object, dst: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="Read-only"):
        fsio.replace_file(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["control.json"]


def test_a_failed_write_removes_the_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int, data: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space"):
        fsio.write_new_file(tmp_path / "data.bin", b"x")
    assert list(tmp_path.iterdir()) == []


def test_write_new_file_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"kept")
    with pytest.raises(FileExistsError):
        fsio.write_new_file(tmp_path / "data.bin", b"other")
    assert (tmp_path / "data.bin").read_bytes() == b"kept"


def test_write_json_atomic_writes_sorted_json_and_refuses_nan(tmp_path: Path) -> None:
    target = tmp_path / "marker.json"
    fsio.write_json_atomic(target, {"b": 1, "a": [2]})
    assert json.loads(target.read_text()) == {"a": [2], "b": 1}
    assert target.read_text().index('"a"') < target.read_text().index('"b"')
    with pytest.raises(ValueError):
        fsio.write_json_atomic(target, {"loss": float("nan")})
    assert json.loads(target.read_text()) == {"a": [2], "b": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["marker.json"]
