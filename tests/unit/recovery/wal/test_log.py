"""Behaviour of the write-ahead log through its public API (single process)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.errors import RecoveryError
from recovery.wal import (
    StepType,
    WALClosedError,
    WALDataError,
    WALError,
    WALStatus,
    WriteAheadLog,
)

pytestmark = pytest.mark.timeout(60)


def _segment_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("wal-*.log"))}


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    log = WriteAheadLog(tmp_path / "wal")
    yield log
    log.close()


def test_append_update_recover_in_append_order(wal: WriteAheadLog) -> None:
    wal.append("g1", StepType.GENERATE)
    wal.append("r1", "reward")
    wal.append("u1", StepType.UPDATE)
    wal.update_status("g1", WALStatus.EXECUTING)
    wal.update_status("g1", "completed")
    wal.update_status("u1", WALStatus.FAILED, error="CUDA OOM")
    pending = wal.recover()
    assert [(e.entry_id, e.status) for e in pending] == [
        ("r1", WALStatus.PENDING),
        ("u1", WALStatus.FAILED),
    ]
    assert pending[1].error == "CUDA OOM"
    assert [e.entry_id for e in wal.entries()] == ["g1", "r1", "u1"]
    got = wal.get("g1")
    assert got is not None and got.status is WALStatus.COMPLETED
    assert got.step_type is StepType.GENERATE
    assert wal.get("missing") is None


def test_state_survives_reopen(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path) as first:
        first.append("a", "generate")
        first.append("b", "reward")
        first.update_status("a", "executing")
        first.update_status("b", "completed")
    with WriteAheadLog(tmp_path) as second:
        assert [(e.entry_id, e.status) for e in second.recover()] == [("a", WALStatus.EXECUTING)]
        assert second.get("b") is not None


def test_data_is_written_beside_the_log_and_verified(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path) as wal:
        entry = wal.append("g1", "generate", data=b"trajectory bytes")
        assert entry.data_path is not None and entry.data_path.parent == tmp_path / "data"
        assert entry.data_path.read_bytes() == b"trajectory bytes"
        assert entry.checksum is not None and entry.checksum.startswith("sha256:")
        assert wal.read_data("g1") == b"trajectory bytes"
        entry.data_path.write_bytes(b"tampered")
        with pytest.raises(WALDataError, match="checksum"):
            wal.read_data("g1")
        wal.append("plain", "reward")
        with pytest.raises(WALDataError, match="no data file"):
            wal.read_data("plain")


def test_external_data_path_is_recorded_with_checksum(tmp_path: Path) -> None:
    external = tmp_path / "rollout.bin"
    external.write_bytes(b"x" * 3000)
    with WriteAheadLog(tmp_path / "wal") as wal:
        entry = wal.append("g1", "generate", data_path=external)
        assert entry.data_path == external.resolve()
    with WriteAheadLog(tmp_path / "wal") as reopened:
        assert reopened.read_data("g1") == b"x" * 3000


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.append("", "generate"), "empty"),
        (lambda w: w.append("   ", "generate"), "blank"),
        (lambda w: w.append(42, "generate"), "must be a string"),
        (lambda w: w.append("x" * 600, "generate"), "more than 512"),
        (lambda w: w.append("new", "sample"), "unknown step type 'sample'"),
        (lambda w: w.append("new", "generate", data="text"), "data must be bytes"),
        (lambda w: w.append("new", "generate", data=b"x", data_path="/etc/hosts"), "not both"),
        (lambda w: w.append("new", "generate", data_path="/nonexistent/f"), "/nonexistent/f"),
        (lambda w: w.append("done", "generate"), "'done' is already in the log"),
        (lambda w: w.append("done", "generate", data=b"dup"), "already in the log"),
        (lambda w: w.update_status("done", "running"), "unknown WAL status 'running'"),
        (lambda w: w.update_status("ghost", "executing"), "unknown entry 'ghost'"),
        (lambda w: w.update_status("done", "failed"), "COMPLETED; it cannot move to failed"),
        (lambda w: w.update_status("done", "pending"), "cannot move to pending"),
        (lambda w: w.update_status("open", "executing", error="x"), "only with FAILED"),
        (lambda w: w.update_status("open", "failed", error=3), "error must be a string"),
        (lambda w: w.update_status("", "failed"), "empty"),
    ],
)
def test_bad_input_raises_clear_error_and_writes_nothing(
    tmp_path: Path, call: object, message: str
) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append("done", "generate")
    wal.update_status("done", "completed")
    wal.append("open", "reward")
    before = _segment_bytes(tmp_path)
    data_before = sorted(os.listdir(tmp_path / "data"))
    entries_before = wal.entries()
    with pytest.raises(WALError, match=message) as info:
        call(wal)  # type: ignore[operator]
    assert isinstance(info.value, RecoveryError)
    assert _segment_bytes(tmp_path) == before
    assert sorted(os.listdir(tmp_path / "data")) == data_before
    assert wal.entries() == entries_before
    wal.close()


def test_completed_to_completed_is_a_no_op(wal: WriteAheadLog) -> None:
    wal.append("a", "generate")
    first = wal.update_status("a", "completed")
    before = _segment_bytes(wal.directory)
    again = wal.update_status("a", "completed")
    assert again == first
    assert _segment_bytes(wal.directory) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"segment_bytes": 10}, "segment_bytes=10 is outside 1024.."),
        ({"segment_bytes": 1 << 40}, "is outside"),
        ({"segment_bytes": "big"}, "segment_bytes must be an int"),
        ({"lock_timeout": 0}, "lock_timeout must be a positive"),
        ({"lock_timeout": -1.0}, "lock_timeout must be a positive"),
    ],
)
def test_bad_constructor_arguments(tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(WALError, match=message):
        WriteAheadLog(tmp_path / "w", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "w").exists()


def test_directory_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WALError, match="cannot create WAL directory"):
        WriteAheadLog(blocker / "wal")


def test_use_after_close_raises(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append("a", "generate")
    wal.close()
    wal.close()  # idempotent
    with pytest.raises(WALClosedError):
        wal.append("b", "generate")
    with pytest.raises(WALClosedError):
        wal.recover()


def test_segments_rotate_and_all_records_survive(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        for i in range(200):
            wal.append(f"e{i:04d}", "generate")
            if i % 3 == 0:
                wal.update_status(f"e{i:04d}", "completed")
        assert len(list(tmp_path.glob("wal-*.log"))) > 5
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        assert [e.entry_id for e in wal.recover()] == [
            f"e{i:04d}" for i in range(200) if i % 3 != 0
        ]


def test_compact_drops_completed_history_and_their_data(tmp_path: Path) -> None:
    external = tmp_path / "keep.bin"
    external.write_bytes(b"caller owns me")
    with WriteAheadLog(tmp_path / "wal", segment_bytes=1024) as wal:
        done = wal.append("done", "generate", data=b"old rollout")
        wal.append("ext", "generate", data_path=external)
        for i in range(50):
            wal.append(f"e{i}", "reward")
            wal.update_status(f"e{i}", "executing")
            if i % 2:
                wal.update_status(f"e{i}", "completed")
        wal.update_status("done", "completed")
        wal.update_status("ext", "completed")
        live = wal.append("live", "update", data=b"still needed")
        wal.update_status("live", "failed", error="boom")
        before = [(e.entry_id, e.status, e.error) for e in wal.recover()]
        assert wal.compact() == 27
        assert [(e.entry_id, e.status, e.error) for e in wal.recover()] == before
        assert [e.entry_id for e in wal.entries()] == [e[0] for e in before]
        assert len(list((tmp_path / "wal").glob("wal-*.log"))) == 1
        assert done.data_path is not None and not done.data_path.exists()
        assert external.exists()
        assert live.data_path is not None and wal.read_data("live") == b"still needed"
        # the log keeps working after compaction
        wal.append("after", "generate")
        wal.update_status("e0", "completed")
    with WriteAheadLog(tmp_path / "wal") as reopened:
        ids = [e.entry_id for e in reopened.recover()]
        assert ids[-1] == "after" and "e0" not in ids and "live" in ids
        assert reopened.get("live") is not None
        assert reopened.get("live").created_at == live.created_at  # type: ignore[union-attr]


def test_two_handles_see_each_others_records(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path) as one, WriteAheadLog(tmp_path) as two:
        one.append("a", "generate")
        two.update_status("a", "executing")
        assert one.get("a").status is WALStatus.EXECUTING  # type: ignore[union-attr]
        two.append("b", "reward")
        with pytest.raises(WALError, match="already in the log"):
            one.append("b", "reward")
        one.compact()
        two.update_status("a", "completed")
        assert [e.entry_id for e in one.recover()] == ["b"]


def test_threads_share_fsyncs(tmp_path: Path) -> None:
    """Group commit inside one process: 8 threads, far fewer fsyncs than records."""
    wal = WriteAheadLog(tmp_path)
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            for i in range(40):
                wal.append(f"t{n}-{i}", "generate")
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    stats = wal.stats()
    assert stats.records == 320
    assert len(wal.entries()) == 320
    assert stats.fsyncs < stats.records * 0.75, stats
    wal.close()


def test_sync_false_writes_without_fsync(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path, sync=False) as wal:
        for i in range(10):
            wal.append(f"e{i}", "generate")
        assert wal.stats().fsyncs == 0
    with WriteAheadLog(tmp_path) as wal:
        assert len(wal.recover()) == 10


def test_compact_removes_old_orphaned_data_files_only(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path) as wal:
        kept = wal.append("kept", "generate", data=b"needed")
        old_orphan = tmp_path / "data" / "killed-before-record.bin"
        old_orphan.write_bytes(b"x")
        os.utime(old_orphan, (1_000_000_000, 1_000_000_000))
        young_orphan = tmp_path / "data" / "append-on-its-way.bin"
        young_orphan.write_bytes(b"y")
        os.utime(kept.data_path, (1_000_000_000, 1_000_000_000))  # type: ignore[arg-type]
        wal.compact()
        assert not old_orphan.exists()
        assert young_orphan.exists()
        assert wal.read_data("kept") == b"needed"
        with pytest.raises(WALError, match="orphan_grace_s must be a number >= 0, got -1"):
            wal.compact(orphan_grace_s=-1)


def test_unopenable_lock_file_is_a_wal_error(tmp_path: Path) -> None:
    (tmp_path / "append.lock").mkdir()
    with pytest.raises(WALError, match="cannot open the lock files"):
        WriteAheadLog(tmp_path)
