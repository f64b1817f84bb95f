"""How the WAL makes records durable: preallocated space, RWF_DSYNC writes, fdatasync."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

# _storage: a fault-injection point (pretend the kernel offers RWF_DSYNC, or has none).
from recovery.wal import PREALLOCATE_BYTES, WriteAheadLog, _storage

# The on-disk record format, on purpose: these tests read, cut and forge segment bytes.
from recovery.wal._format import END_MARK, scan

pytestmark = pytest.mark.timeout(60)


class SyncCalls:
    """Counts the system calls that make data durable, passing them through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fdatasync = 0
        self.dsync_writes = 0
        real_fdatasync, real_pwritev = os.fdatasync, os.pwritev

        def fdatasync(fd: int) -> None:
            self.fdatasync += 1
            real_fdatasync(fd)

        def pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
            if flags & getattr(os, "RWF_DSYNC", 0):
                self.dsync_writes += 1
            return real_pwritev(fd, buffers, offset, flags)

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(os, "pwritev", pwritev)


def _segment(directory: Path) -> Path:
    return sorted(directory.glob("wal-*.log"))[-1]


def test_the_segment_is_preallocated_with_zeros_after_the_records(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path) as wal:
        wal.append("a", "generate")
        wal.update_status("a", "executing")
    content = _segment(tmp_path).read_bytes()
    result = scan(content)
    assert [r.payload["id"] for r in result.records] == ["a", "a"]
    assert result.zero_tail and result.problem is None
    assert len(content) >= PREALLOCATE_BYTES  # room for the next records, durable already
    assert content[result.valid_end :] == bytes(len(content) - result.valid_end)


@pytest.mark.skipif(not hasattr(os, "RWF_DSYNC"), reason="needs os.RWF_DSYNC (Linux 4.7+)")
def test_a_lone_writer_syncs_each_record_with_its_own_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing else in flight and everything before it durable: one RWF_DSYNC write per
    record, no fdatasync, and the log reads back whole."""
    wal = WriteAheadLog(tmp_path)
    wal.append("warm", "generate")  # the first record also preallocates the segment
    calls = SyncCalls(monkeypatch)
    for i in range(20):
        wal.append(f"e{i}", "generate")
        wal.update_status(f"e{i}", "completed")
    assert (calls.dsync_writes, calls.fdatasync) == (40, 0)
    stats = wal.stats()
    assert stats.fsyncs >= 40 and stats.sync_seconds > 0
    wal.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert [e.entry_id for e in reopened.recover()] == ["warm"]
        assert len(reopened.entries()) == 21


def test_a_record_after_records_not_yet_durable_is_synced_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records written with sync=False leave the durable mark behind; the next synced
    append must not use a range-limited RWF_DSYNC write but fdatasync the whole segment."""
    durable = WriteAheadLog(tmp_path)
    durable.append("first", "generate")
    fast = WriteAheadLog(tmp_path, sync=False)
    for i in range(5):
        fast.append(f"unsynced-{i}", "generate")
    calls = SyncCalls(monkeypatch)
    durable.append("covers-all", "generate")
    assert calls.dsync_writes == 0 and calls.fdatasync == 1
    assert len(durable.entries()) == 7
    fast.close()
    durable.close()


def test_a_kernel_without_rwf_dsync_falls_back_to_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_storage, "_RWF_DSYNC", getattr(os, "RWF_DSYNC", 16))
    real_pwritev = os.pwritev
    refused: list[int] = []

    def pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        if flags:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_pwritev(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "pwritev", pwritev)
    with WriteAheadLog(tmp_path) as wal:
        for i in range(3):
            wal.append(f"e{i}", "generate")
        assert wal.stats().fsyncs >= 3
    assert len(refused) == 1  # tried once, then never again
    assert _storage._RWF_DSYNC is None
    content = _segment(tmp_path).read_bytes()
    result = scan(content)
    assert [r.payload["id"] for r in result.records] == ["e0", "e1", "e2"]
    assert content[result.valid_end : result.valid_end + len(END_MARK)] == END_MARK
