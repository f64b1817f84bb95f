from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointCorrupt, CheckpointInputError


def _commit(root: Path, name: str, payload: bytes) -> Path:
    tmp = atomic.make_tmp_dir(root, name)
    digest = atomic.write_file_durable(tmp / "data.bin", payload)
    final = root / name
    atomic.commit_dir(tmp, final, files=[digest], marker_name="DONE", metadata={"k": 1})
    return final


def test_commit_then_verify_returns_metadata(tmp_path: Path) -> None:
    final = _commit(tmp_path, "a", b"x" * 1000)
    body = atomic.verify_committed_dir(final, "DONE")
    assert body["metadata"] == {"k": 1}
    assert body["files"]["data.bin"]["size"] == 1000
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(atomic.TMP_PREFIX)]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / "DONE").unlink(), "no DONE marker"),
        (lambda d: (d / "data.bin").write_bytes(b"x" * 999), "999 bytes"),
        (lambda d: (d / "data.bin").write_bytes(b"y" + b"x" * 999), "checksum mismatch"),
        (lambda d: (d / "data.bin").unlink(), "missing"),
        (lambda d: (d / "DONE").write_text("{"), "unreadable"),
    ],
)
def test_damaged_directory_is_rejected_with_reason(tmp_path: Path, damage, reason: str) -> None:
    final = _commit(tmp_path, "a", b"x" * 1000)
    damage(final)
    with pytest.raises(CheckpointCorrupt, match=reason):
        atomic.verify_committed_dir(final, "DONE")


def test_marker_edit_is_caught_by_its_own_checksum(tmp_path: Path) -> None:
    final = _commit(tmp_path, "a", b"x" * 10)
    marker = json.loads((final / "DONE").read_text())
    marker["body"]["metadata"]["k"] = 2
    (final / "DONE").write_text(json.dumps(marker))
    with pytest.raises(CheckpointCorrupt, match="its own checksum"):
        atomic.verify_committed_dir(final, "DONE")


def test_commit_refuses_to_overwrite_and_leaves_tmp(tmp_path: Path) -> None:
    _commit(tmp_path, "a", b"1")
    tmp = atomic.make_tmp_dir(tmp_path, "a")
    digest = atomic.write_file_durable(tmp / "data.bin", b"2")
    with pytest.raises(CheckpointInputError, match="overwrite"):
        atomic.commit_dir(tmp, tmp_path / "a", files=[digest], marker_name="DONE", metadata={})
    assert (tmp_path / "a" / "data.bin").read_bytes() == b"1"


def test_commit_refuses_unlisted_files(tmp_path: Path) -> None:
    tmp = atomic.make_tmp_dir(tmp_path, "b")
    digest = atomic.write_file_durable(tmp / "data.bin", b"2")
    (tmp / "stray").write_bytes(b"")
    with pytest.raises(CheckpointInputError, match="stray"):
        atomic.commit_dir(tmp, tmp_path / "b", files=[digest], marker_name="DONE", metadata={})
    assert not (tmp_path / "b").exists()


def _aligned_buffer(size: int, misalign: int = 0) -> memoryview:
    import mmap

    block = mmap.mmap(-1, size + atomic.DIRECT_ALIGN)  # page aligned
    view = memoryview(block)[misalign : misalign + size]
    view[:] = bytes((i * 7 + 3) % 251 for i in range(size))
    return view


@pytest.mark.parametrize(
    ("size", "misalign", "mode"),
    [
        (3 * 4096 + 123, 0, "direct"),  # aligned bulk via O_DIRECT, short tail buffered
        (2 * 4096, 0, "direct"),
        (5000, 8, "buffered"),  # unaligned memory: plain buffered write
    ],
)
def test_direct_write_round_trips(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, size: int, misalign: int, mode: str
) -> None:
    view = _aligned_buffer(size, misalign)
    caplog.set_level("DEBUG", logger="rlguard.recovery.checkpoint.atomic")
    digest = atomic.write_file_durable(tmp_path / "f", view, direct=True, chunk_size=8192)
    assert (tmp_path / "f").read_bytes() == bytes(view)
    assert digest == atomic.digest_file(tmp_path / "f")
    assert f"bytes {mode}" in caplog.text
    crc = atomic.write_file_durable(tmp_path / "g", view, direct=True, checksum="crc32")
    assert crc.algorithm == "crc32" and crc == atomic.digest_file(tmp_path / "g", checksum="crc32")


def test_unknown_checksum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointInputError, match="checksum must be one of"):
        atomic.write_file_durable(tmp_path / "f", b"x", checksum="md5")
    assert not (tmp_path / "f").exists()
