"""Damaged logs: flipped bytes, torn tails, leftovers of interrupted writers and compactions."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from recovery.wal import WALCorruptionError, WALStatus, WriteAheadLog

# The on-disk record format, on purpose: these tests read, cut and forge segment bytes.
from recovery.wal._format import END_MARK, HEADER, encode_record, scan

pytestmark = pytest.mark.timeout(120)


def _build(directory: Path, n: int = 6, *, segment_bytes: int = 1 << 20) -> list[int]:
    """Write n entries (every second one completed); return each record's end offset."""
    ends: list[int] = []
    with WriteAheadLog(directory, segment_bytes=segment_bytes) as wal:
        for i in range(n):
            wal.append(f"e{i}", "generate")
            ends.append(_records_end(directory))
            if i % 2:
                wal.update_status(f"e{i}", "completed")
                ends.append(_records_end(directory))
    return ends


def _only_segment(directory: Path) -> Path:
    segments = sorted(directory.glob("wal-*.log"))
    return segments[-1]


def _records_end(directory: Path) -> int:
    """Where the records of the last segment end (the preallocated zeros follow)."""
    result = scan(_only_segment(directory).read_bytes())
    assert result.problem is None
    return result.valid_end


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def _status_map(wal: WriteAheadLog) -> dict[str, WALStatus]:
    return {e.entry_id: e.status for e in wal.entries()}


@pytest.mark.parametrize("where", ["header", "length", "payload", "last-byte"])
def test_flipped_byte_in_last_record_is_truncated_on_open(
    tmp_path: Path, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    ends = _build(tmp_path)
    segment = _only_segment(tmp_path)
    last_start, last_end = ends[-2], ends[-1]
    offset = {
        "header": last_start,
        "length": last_start + 5,
        "payload": last_start + HEADER.size + 3,
        "last-byte": last_end - 1,
    }[where]
    _flip(segment, offset)
    with caplog.at_level(logging.WARNING, logger="rlguard.recovery.wal"):
        wal = WriteAheadLog(tmp_path)
    assert "torn or corrupt tail" in caplog.text
    assert segment.stat().st_size == last_start
    # the last record was e5 -> completed; without it e5 is back to PENDING
    assert _status_map(wal)["e5"] is WALStatus.PENDING
    assert _status_map(wal)["e3"] is WALStatus.COMPLETED
    wal.update_status("e5", "executing")
    wal.close()
    with WriteAheadLog(tmp_path) as again:
        assert _status_map(again)["e5"] is WALStatus.EXECUTING


def test_flipped_byte_in_the_middle_is_reported_not_skipped(tmp_path: Path) -> None:
    ends = _build(tmp_path)
    segment = _only_segment(tmp_path)
    victim_start = ends[2]
    _flip(segment, victim_start + HEADER.size + 4)
    before = segment.read_bytes()
    with pytest.raises(WALCorruptionError) as info:
        WriteAheadLog(tmp_path)
    assert info.value.offset == victim_start
    assert info.value.segment == segment
    assert "checksum mismatch" in str(info.value) and f"byte {victim_start}" in str(info.value)
    assert segment.read_bytes() == before  # nothing was truncated or rewritten


def test_corruption_in_an_older_segment_is_reported(tmp_path: Path) -> None:
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        for i in range(60):
            wal.append(f"e{i}", "generate")
    first = sorted(tmp_path.glob("wal-*.log"))[0]
    size = first.stat().st_size
    _flip(first, size - 1)  # the tail of a segment that is not the last one
    with pytest.raises(WALCorruptionError) as info:
        WriteAheadLog(tmp_path, segment_bytes=1024)
    assert info.value.segment == first


def test_truncation_at_every_offset_of_the_last_record(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    ends = _build(pristine)
    last_start, last_end = ends[-2], ends[-1]
    content = _only_segment(pristine).read_bytes()
    for cut in range(last_start, last_end + 1):
        work = tmp_path / f"cut{cut}"
        shutil.copytree(pristine, work)
        _only_segment(work).write_bytes(content[:cut])
        with WriteAheadLog(work) as wal:
            statuses = _status_map(wal)
            assert statuses["e5"] is (WALStatus.COMPLETED if cut == last_end else WALStatus.PENDING)
            assert statuses["e3"] is WALStatus.COMPLETED and len(statuses) == 6
        assert _only_segment(work).stat().st_size == (last_end if cut == last_end else last_start)
        shutil.rmtree(work)


@pytest.mark.parametrize("where", ["after the last record", "after the preallocated zeros"])
def test_random_garbage_after_the_last_record_is_truncated(tmp_path: Path, where: str) -> None:
    ends = _build(tmp_path)
    segment = _only_segment(tmp_path)
    garbage = b"RLW1\xff\xff\x00\x00garbage" + bytes(range(256))
    content = segment.read_bytes()
    assert content[ends[-1] :] == bytes(len(content) - ends[-1])  # zeros ahead of the records
    offset = ends[-1] if where == "after the last record" else len(content)
    segment.write_bytes(content[:offset] + garbage)
    with WriteAheadLog(tmp_path) as wal:
        assert len(wal.entries()) == 6
    assert segment.stat().st_size == ends[-1]


def test_bytes_of_an_interrupted_writer_never_become_a_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A writer killed after writing its record but before it counted leaves the record at the
    write position; a live handle's next (shorter) record overwrites its start, and the end
    mark after it keeps the rest from being read. Reopening drops the rest with a warning."""
    wal = WriteAheadLog(tmp_path)
    wal.append("a", "generate")
    segment = _only_segment(tmp_path)
    end = _records_end(tmp_path)
    ghost = encode_record(
        {"k": "a", "id": "ghost" * 40, "t": "generate", "s": "pending", "ts": 1.0}
    )
    with segment.open("r+b") as handle:
        handle.seek(end)
        handle.write(ghost + END_MARK)
    wal.append("b", "reward")
    content = segment.read_bytes()
    b_end = _records_end(tmp_path)
    assert content[b_end : b_end + len(END_MARK)] == END_MARK
    assert b"ghostghost" in content[b_end:]  # the rest of the ghost is still there
    assert [e.entry_id for e in wal.entries()] == ["a", "b"]
    wal.close()
    with caplog.at_level(logging.WARNING, logger="rlguard.recovery.wal"):
        reopened = WriteAheadLog(tmp_path)
    assert "bytes after the end mark" in caplog.text
    assert [e.entry_id for e in reopened.entries()] == ["a", "b"]
    assert b"ghost" not in segment.read_bytes()
    reopened.append("c", "update")
    reopened.close()
    with WriteAheadLog(tmp_path) as again:
        assert [e.entry_id for e in again.entries()] == ["a", "b", "c"]


def test_a_whole_record_left_at_the_write_position_is_found_on_open(tmp_path: Path) -> None:
    """The kill came after the record was written but before the call returned: the record
    is there, whole, and the next open counts it (the append was in flight, not invented)."""
    with WriteAheadLog(tmp_path) as wal:
        wal.append("a", "generate")
    end = _records_end(tmp_path)
    record = encode_record({"k": "a", "id": "late", "t": "generate", "s": "pending", "ts": 1.0})
    with _only_segment(tmp_path).open("r+b") as handle:
        handle.seek(end)
        handle.write(record + END_MARK)
    with WriteAheadLog(tmp_path) as wal:
        assert [e.entry_id for e in wal.entries()] == ["a", "late"]
        wal.append("b", "generate")
        assert [e.entry_id for e in wal.entries()] == ["a", "late", "b"]


def test_a_zeroed_header_reads_as_the_end_of_the_log(tmp_path: Path) -> None:
    """Records past a span of zeros (pages written out of order before a power loss, none
    acknowledged) are not read: the log ends at the first zero header, and reopening drops
    what lies after it."""
    ends = _build(tmp_path)
    segment = _only_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[ends[-3] : ends[-2]] = bytes(ends[-2] - ends[-3])  # one whole record reads as zeros
    segment.write_bytes(bytes(data))
    with WriteAheadLog(tmp_path) as wal:
        assert len(wal.entries()) == 5  # e5 was the record zeroed; its completion is dropped
    assert segment.stat().st_size == ends[-3]


def test_leftovers_of_an_interrupted_compaction(tmp_path: Path) -> None:
    """Crash after the compacted segment was renamed in but before old ones were deleted:
    the compacted segment supersedes them; a half-written .tmp is discarded."""
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        for i in range(40):
            wal.append(f"e{i}", "generate")
            if i % 4:
                wal.update_status(f"e{i}", "completed")
        expected = [(e.entry_id, e.status) for e in wal.recover()]
    saved = {p.name: p.read_bytes() for p in tmp_path.glob("wal-*.log")}
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        wal.compact()
    compacted = sorted(tmp_path.glob("wal-*.log"))
    assert len(compacted) == 1
    for name, data in saved.items():  # put the superseded segments back
        (tmp_path / name).write_bytes(data)
    (tmp_path / (compacted[0].name.replace(".log", "9.log.tmp"))).write_bytes(b"half")
    with WriteAheadLog(tmp_path, segment_bytes=1024) as wal:
        assert [(e.entry_id, e.status) for e in wal.entries()] == expected
    assert sorted(tmp_path.glob("wal-*.log")) == compacted
    assert not list(tmp_path.glob("*.tmp"))


def test_state_from_a_previous_boot_is_rebuilt(tmp_path: Path) -> None:
    _build(tmp_path)
    state = tmp_path / "wal.state"
    data = bytearray(state.read_bytes())
    data[8:24] = b"\x01" * 16  # another boot id
    data[32:64] = b"\xff" * 32  # nonsense positions
    state.write_bytes(bytes(data))
    with WriteAheadLog(tmp_path) as wal:
        assert len(wal.entries()) == 6
        wal.append("after-reboot", "generate")
    with WriteAheadLog(tmp_path) as wal:
        assert wal.get("after-reboot") is not None
