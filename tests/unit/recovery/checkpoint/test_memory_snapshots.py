"""Memory snapshots (recovery/checkpoint/memory_snapshots.py) on real files, and their owner's
background persister (persister.py): committed in the engine's format and read back by its
reader, pages reused, a torn or damaged snapshot never chosen, space refused with the sizes
named, a disk that refuses counted and survived."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recovery.checkpoint import atomic
from recovery.checkpoint.errors import CheckpointInputError
from recovery.checkpoint.layout import MARKER, list_dirs
from recovery.checkpoint.memory_snapshots import MemorySnapshotWriter, SnapshotSpaceError
from recovery.checkpoint.persister import STATUS_FILE, SnapshotPersister, read_status
from recovery.checkpoint.reader import CheckpointReader
from recovery.checkpoint.segment_owner import owner_alive, write_owner
from recovery.checkpoint.version import VersionVector

pytestmark = pytest.mark.timeout(60)


def _state(step: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.zeros(32)},
        "optimizer": {"state": {0: {"step": torch.tensor(float(step))}}, "param_groups": []},
        "rng": b"\x00\x01" * step,
        "step": step,
    }


def _save(writer: MemorySnapshotWriter, step: int) -> Path:
    return writer.save(_state(step), version=VersionVector(step, step)).path


def test_snapshots_read_back_bit_exact_through_the_engines_reader(tmp_path: Path) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm")
    for step in range(1, 5):
        _save(writer, step)
    loaded = CheckpointReader(tmp_path / "shm").load_latest()
    assert loaded is not None
    info, state = loaded
    assert info.version == VersionVector(4, 4)
    want = _state(4)
    assert torch.equal(state["model"]["w"], want["model"]["w"])  # type: ignore[index]
    assert state["rng"] == want["rng"] and state["step"] == 4
    # keep=2: the two newest, the older ones' directories reused for them
    assert [s for s, _ in sorted(list_dirs(tmp_path / "shm"))] == [3, 4]


def test_the_oldest_snapshots_file_is_reused_in_place(tmp_path: Path) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm")
    first = _save(writer, 1)
    inode = (first / "core.bin").stat().st_ino
    _save(writer, 2)
    third = _save(writer, 3)  # takes snapshot 1's directory
    assert (third / "core.bin").stat().st_ino == inode


def test_a_damaged_newest_snapshot_is_passed_over_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm")
    _save(writer, 1)
    newest = _save(writer, 2)
    with open(newest / "core.bin", "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    caplog.set_level(logging.WARNING)
    loaded = CheckpointReader(tmp_path / "shm").load_latest()
    assert loaded is not None and loaded[0].version.training_step == 1
    assert any(
        "checksum" in r.getMessage() and newest.name in r.getMessage() for r in caplog.records
    )


def test_a_kill_between_copy_and_marker_leaves_no_snapshot_of_that_step(tmp_path: Path) -> None:
    """A real kill -9 of a writer process right after its copy (the after_copy hook)."""
    root = tmp_path / "shm"
    script = f"""
import os, signal, sys, torch
sys.path.insert(0, {str(Path.cwd())!r})
from recovery.checkpoint.memory_snapshots import MemorySnapshotWriter
from recovery.checkpoint.version import VersionVector
def kill(seq):
    if seq == 3:
        os.kill(os.getpid(), signal.SIGKILL)
w = MemorySnapshotWriter({str(root)!r}, after_copy=kill)
for step in (1, 2, 3):
    w.save({{"model": {{"w": torch.full((1000,), float(step))}}}}, version=VersionVector(step, step))
"""
    proc = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True)
    assert proc.returncode == -9, proc.stderr.decode()
    assert any(p.name.startswith(".tmp-") for p in root.iterdir())  # the torn one
    loaded = CheckpointReader(root).load_latest()
    assert loaded is not None and loaded[0].version.training_step == 2
    assert torch.equal(loaded[1]["model"]["w"], torch.full((1000,), 2.0))
    # The next writer sweeps the torn one and numbers after the committed ones.
    saved = MemorySnapshotWriter(root).save(
        {"model": {"w": torch.ones(3)}}, version=VersionVector(3, 3)
    )
    assert saved.seq == 3 and not any(p.name.startswith(".tmp-") for p in root.iterdir())


def test_too_little_space_is_refused_with_the_sizes_named(tmp_path: Path) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm", limit_bytes=4096)
    with pytest.raises(
        SnapshotSpaceError, match=r"2 x [\d,]+ = [\d,]+ bytes.*limit of 4,096 bytes"
    ):
        _save(writer, 1)
    assert list_dirs(tmp_path / "shm") == []


@pytest.mark.parametrize("keep", [1, 0, True, "2"])
def test_a_bad_keep_is_refused(tmp_path: Path, keep: object) -> None:
    with pytest.raises(CheckpointInputError, match="keep must be an int >= 2"):
        MemorySnapshotWriter(tmp_path, keep=keep)  # type: ignore[arg-type]


def test_the_persister_copies_new_snapshots_and_keeps_n(tmp_path: Path) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm")
    persister = SnapshotPersister([(tmp_path / "shm", tmp_path / "disk")], keep=2)
    for step in range(1, 5):
        _save(writer, step)
        assert persister.persist_once() == [step]
    assert persister.persist_once() == []  # nothing new
    assert [s for s, _ in sorted(list_dirs(tmp_path / "disk"))] == [3, 4]
    loaded = CheckpointReader(tmp_path / "disk").load_latest()
    assert loaded is not None and loaded[0].version.training_step == 4
    assert read_status(tmp_path / "shm")["persisted_seq"] == 4


def test_a_disk_that_refuses_is_counted_and_persisting_goes_on(tmp_path: Path) -> None:
    writer = MemorySnapshotWriter(tmp_path / "shm")
    blocked = tmp_path / "disk"
    blocked.write_text("a file where the directory should be", encoding="utf-8")
    persister = SnapshotPersister([(tmp_path / "shm", blocked)])
    _save(writer, 1)
    assert persister.persist_once() == []
    status = read_status(tmp_path / "shm")
    assert status["errors"] == 1 and str(blocked) in status["last_error"]
    # what the heartbeat sends as label values: the directory, and the error without file names
    # (the same text for every snapshot the same fault refuses)
    assert status["dir"] == str(blocked)
    assert status["error"].startswith("[Errno ") and str(tmp_path) not in status["error"]
    assert persister.persist_once() == []  # the same snapshot is not retried (or recounted)
    assert read_status(tmp_path / "shm")["errors"] == 1
    blocked.unlink()
    _save(writer, 2)
    assert persister.persist_once() == [2]
    assert (tmp_path / "shm" / STATUS_FILE).exists()


def test_a_snapshot_reused_or_changed_while_persisted_is_not_committed(tmp_path: Path) -> None:
    """The persister read a marker, then the trainer reused that directory (gone) or its bytes
    changed under the copy (checksum): neither becomes a disk snapshot, neither is an error."""
    writer = MemorySnapshotWriter(tmp_path / "shm")
    old = _save(writer, 1)
    newer = _save(writer, 2)
    old_body = atomic.read_marker(old, MARKER)
    newer_body = atomic.read_marker(newer, MARKER)
    persister = SnapshotPersister([(tmp_path / "shm", tmp_path / "disk")])
    target = persister.targets[0]
    _save(writer, 3)  # reuses snapshot 1's directory
    assert not old.exists()
    assert persister._persist(target, 1, old, old_body) is None
    with open(newer / "core.bin", "r+b") as handle:  # as if overwritten mid-copy
        handle.write(b"\xff" * 16)
    assert persister._persist(target, 2, newer, newer_body) is None
    assert list_dirs(tmp_path / "disk") == []
    assert read_status(tmp_path / "shm").get("errors", 0) == 0


def test_owner_alive_follows_the_owner_process(tmp_path: Path) -> None:
    assert not owner_alive(tmp_path)
    write_owner(tmp_path, os.getpid())
    assert owner_alive(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    write_owner(tmp_path, child.pid)  # exited and reaped
    assert not owner_alive(tmp_path)
