"""append_many / update_many: several changes in one record, one sync, all or nothing."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest

from recovery.wal import NewEntry, StatusChange, WALError, WALStatus, WriteAheadLog

# The on-disk record format, on purpose: these tests read, cut and forge segment bytes.
from recovery.wal._format import HEADER, scan

pytestmark = pytest.mark.timeout(60)


def _segments(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("wal-*.log"))}


def _data_files(directory: Path) -> list[str]:
    return sorted(p.name for p in (directory / "data").iterdir())


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    log = WriteAheadLog(tmp_path / "wal")
    yield log
    log.close()


def test_append_many_logs_every_entry_in_order_with_one_record(wal: WriteAheadLog) -> None:
    wal.append("first", "generate")
    out = wal.append_many(
        [("g1", "generate"), NewEntry("r1", "reward", data=b"scores"), ("u1", "update")]
    )
    assert [(e.entry_id, e.status) for e in out] == [
        ("g1", WALStatus.PENDING),
        ("r1", WALStatus.PENDING),
        ("u1", WALStatus.PENDING),
    ]
    assert [e.entry_id for e in wal.recover()] == ["first", "g1", "r1", "u1"]
    assert wal.read_data("r1") == b"scores"
    records = scan(next(iter(_segments(wal.directory).values()))).records
    assert [r.payload["k"] for r in records] == ["a", "m"]  # three entries, one record
    assert wal.stats().records == 2


def test_update_many_applies_in_order_and_one_entry_may_move_twice(wal: WriteAheadLog) -> None:
    wal.append_many([("a", "generate"), ("b", "generate")])
    out = wal.update_many(
        [("a", "executing"), StatusChange("b", "failed", error="oom"), ("a", "completed")]
    )
    assert [(e.entry_id, e.status) for e in out] == [
        ("a", WALStatus.EXECUTING),
        ("b", WALStatus.FAILED),
        ("a", WALStatus.COMPLETED),
    ]
    assert wal.get("a").status is WALStatus.COMPLETED  # type: ignore[union-attr]
    assert wal.get("b").error == "oom"  # type: ignore[union-attr]
    assert [e.entry_id for e in wal.recover()] == ["b"]


def test_batches_survive_reopening_and_are_seen_by_another_handle(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    with WriteAheadLog(directory) as writer, WriteAheadLog(directory) as other:
        writer.append_many([("x", "generate"), ("y", "reward")])
        writer.update_many([("x", "completed"), ("y", "executing")])
        assert {e.entry_id: e.status for e in other.entries()} == {
            "x": WALStatus.COMPLETED,
            "y": WALStatus.EXECUTING,
        }
    with WriteAheadLog(directory) as reopened:
        assert [(e.entry_id, e.status) for e in reopened.recover()] == [("y", WALStatus.EXECUTING)]
        assert reopened.compact() == 1
        assert [e.entry_id for e in reopened.entries()] == ["y"]


def test_empty_lists_write_nothing(wal: WriteAheadLog) -> None:
    before = _segments(wal.directory)
    assert wal.append_many([]) == []
    assert wal.update_many([]) == []
    assert _segments(wal.directory) == before


def test_completed_to_completed_inside_a_batch_is_skipped_not_refused(wal: WriteAheadLog) -> None:
    wal.append_many([("a", "generate"), ("b", "generate")])
    wal.update_status("a", "completed")
    before = _segments(wal.directory)
    out = wal.update_many([("a", "completed")])  # only a no-op: no record at all
    assert out[0].status is WALStatus.COMPLETED
    assert _segments(wal.directory) == before
    out = wal.update_many([("a", "completed"), ("b", "executing")])
    assert [e.status for e in out] == [WALStatus.COMPLETED, WALStatus.EXECUTING]
    last = scan(next(iter(_segments(wal.directory).values()))).records[-1].payload
    assert last["k"] == "s" and last["id"] == "b"  # the no-op part was left out


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([("a", "generate"), ("a", "reward")], "'a' is given twice"),
        ([("ok", "generate"), ("", "generate")], "must not be empty"),
        ([("ok", "generate"), ("b", "sleep")], "unknown step type 'sleep'"),
        ([("ok", "generate"), "just-an-id"], "item 1 is 'just-an-id'"),
        ([("ok", "generate"), ("a", "generate", "extra")], "item 1"),
        ([NewEntry("ok", "generate", data=b"x", data_path="/etc/hostname")], "not both"),
        ([NewEntry("ok", "generate", data="text")], "data must be bytes"),  # type: ignore[arg-type]
        ([NewEntry("ok", "generate", data_path="/no/such/file")], "not an existing file"),
        ("ab", "takes a list of entries"),
        (5, "takes a list of entries, got 5"),
    ],
)
def test_append_many_refuses_bad_input_and_writes_nothing(
    wal: WriteAheadLog, items: object, message: str
) -> None:
    wal.append("existing", "generate")
    before = _segments(wal.directory)
    with pytest.raises(WALError, match=message):
        wal.append_many(items)  # type: ignore[arg-type]
    assert _segments(wal.directory) == before
    assert [e.entry_id for e in wal.entries()] == ["existing"]
    assert _data_files(wal.directory) == []


def test_append_many_with_a_known_id_writes_nobody_s_data_file(wal: WriteAheadLog) -> None:
    wal.append("taken", "generate")
    before = _segments(wal.directory)
    with pytest.raises(WALError, match="'taken' is already in the log"):
        wal.append_many([NewEntry("fresh", "generate", data=b"d"), NewEntry("taken", "reward")])
    assert _segments(wal.directory) == before
    assert _data_files(wal.directory) == []
    assert wal.get("fresh") is None


def test_append_many_too_big_for_one_record_is_refused(wal: WriteAheadLog) -> None:
    items = [NewEntry(f"e{i:05d}-" + "x" * 400, "generate", data=b"d") for i in range(3000)]
    with pytest.raises(WALError, match="split them over several calls"):
        wal.append_many(items)
    assert wal.entries() == []
    assert _data_files(wal.directory) == []  # the data files written first were removed


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ([("a", "executing"), ("nobody", "failed")], "unknown entry 'nobody'"),
        ([("a", "completed"), ("a", "executing")], "'a' is COMPLETED"),
        ([("a", "executing"), ("a", "asleep")], "unknown WAL status 'asleep'"),
        ([StatusChange("a", "executing", error="why")], "only with FAILED"),
        ([("a", "executing"), 7], "item 1 is 7"),
        ({"a": "executing"}, "takes a list of changes"),
        (None, "takes a list of changes, got None"),
    ],
)
def test_update_many_refuses_bad_changes_and_applies_none(
    wal: WriteAheadLog, changes: object, message: str
) -> None:
    wal.append("a", "generate")
    before = _segments(wal.directory)
    with pytest.raises(WALError, match=message):
        wal.update_many(changes)  # type: ignore[arg-type]
    assert _segments(wal.directory) == before
    assert wal.get("a").status is WALStatus.PENDING  # type: ignore[union-attr]
    wal.update_status("a", "executing")  # the index was not left half-changed
    assert wal.get("a").status is WALStatus.EXECUTING  # type: ignore[union-attr]


def test_a_torn_group_record_loses_all_of_its_entries_together(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    with WriteAheadLog(directory) as wal:
        wal.append("before", "generate")
        wal.append_many([(f"g{i}", "generate") for i in range(5)])
    segment = next(directory.glob("wal-*.log"))
    content = segment.read_bytes()
    result = scan(content)
    group = result.records[-1]
    for cut in (group.offset + HEADER.size + 3, group.end - 1):
        segment.write_bytes(content[:cut])
        with WriteAheadLog(directory) as reopened:
            assert [e.entry_id for e in reopened.entries()] == ["before"]
        segment.write_bytes(content)


def _append_batches(directory: str, writer: int, batches: int) -> None:
    with WriteAheadLog(directory) as wal:
        for b in range(batches):
            wal.append_many([(f"w{writer}-b{b}-{i}", "generate") for i in range(4)])
            wal.update_many([(f"w{writer}-b{b}-{i}", "completed") for i in range(0, 4, 2)])


def test_batches_from_several_processes(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    WriteAheadLog(directory).close()
    ctx = multiprocessing.get_context("spawn")  # no inherited threads or locks
    procs = [ctx.Process(target=_append_batches, args=(str(directory), w, 25)) for w in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(30)
        assert proc.exitcode == 0
    with WriteAheadLog(directory) as wal:
        entries = wal.entries()
        assert len(entries) == 3 * 25 * 4
        for writer in range(3):
            mine = [e.entry_id for e in entries if e.entry_id.startswith(f"w{writer}-")]
            assert mine == [f"w{writer}-b{b}-{i}" for b in range(25) for i in range(4)]
        assert len(wal.recover()) == 3 * 25 * 2
