"""The state log: durable JSON lines, measured latency, torn-line tolerance."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from recovery import statelog as statelog_module
from recovery.errors import RecoveryError
from recovery.statelog import (
    StateLog,
    StateLogCorruptError,
    StateLogError,
    StateRecord,
    last_state_record,
    read_state_log,
)

pytestmark = pytest.mark.timeout(60)


def test_append_writes_one_json_line_per_transition(tmp_path: Path) -> None:
    path = tmp_path / "run" / "state_log.jsonl"
    with StateLog(path) as log:
        assert log.last_write_latency_ms is None
        first = log.append("PREPARE", {"step": 0})
        log.append("ROLLOUT", {"step": 0, "attempt": 1})
        assert log.appends == 2
        assert log.last_write_latency_ms is not None and log.last_write_latency_ms > 0
        assert log.max_write_latency_ms is not None
        assert log.max_write_latency_ms >= log.last_write_latency_ms
    lines = path.read_text().splitlines()
    assert [json.loads(line)["state"] for line in lines] == ["PREPARE", "ROLLOUT"]
    assert json.loads(lines[0]) == {"ts": first.ts, "state": "PREPARE", "payload": {"step": 0}}
    assert read_state_log(path) == [
        first,
        StateRecord(
            ts=json.loads(lines[1])["ts"], state="ROLLOUT", payload={"step": 0, "attempt": 1}
        ),
    ]


def test_latency_includes_the_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow disk shows up in last_write_latency_ms (the golden metric)."""
    real = statelog_module.os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        import time

        time.sleep(0.06)
        real(fd)

    monkeypatch.setattr(statelog_module.os, "fdatasync", slow_fdatasync)
    with StateLog(tmp_path / "s.jsonl") as log:
        log.append("TRAIN")
        assert log.last_write_latency_ms is not None and log.last_write_latency_ms >= 60


def test_reader_ignores_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with StateLog(path) as log:
        log.append("A")
        log.append("B")
    with path.open("ab") as handle:
        handle.write(b'{"ts": 1.0, "state": "C", "pay')
    assert [r.state for r in read_state_log(path)] == ["A", "B"]
    last = last_state_record(path)
    assert last is not None and last.state == "B"


def test_writer_cuts_a_torn_line_before_appending(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.jsonl"
    with StateLog(path) as log:
        log.append("A")
    with path.open("ab") as handle:
        handle.write(b'{"ts": 1.0, "sta')
    with caplog.at_level(logging.WARNING, logger="rlguard.recovery.statelog"):
        with StateLog(path) as log:
            log.append("B")
    assert "torn last line" in caplog.text
    assert [r.state for r in read_state_log(path)] == ["A", "B"]


def test_torn_line_without_any_newline(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"ts": 1')
    assert read_state_log(path) == []
    assert last_state_record(path) is None
    with StateLog(path) as log:
        log.append("A")
    assert [r.state for r in read_state_log(path)] == ["A"]


def test_damaged_line_in_the_middle_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with StateLog(path) as log:
        for state in "ABC":
            log.append(state)
    lines = path.read_bytes().split(b"\n")
    lines[1] = b'{"ts": 2.0, "state": "B", "payload": {oops'
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(StateLogCorruptError, match="line 2"):
        read_state_log(path)
    # the tail reader only reaches the damage if it has to
    assert last_state_record(path).state == "C"  # type: ignore[union-attr]
    with pytest.raises(StateLogCorruptError, match="damaged line"):
        last_state_record(path, match=lambda r: r.state == "A")


def test_last_state_record_with_match_reads_backwards_across_chunks(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with StateLog(path, sync=False) as log:
        log.append("TRAIN", {"machine": "trainer-0", "step": 0})
        for i in range(3000):  # ~200 KiB: several 64 KiB chunks
            log.append("ROLLOUT", {"machine": "rollout-1", "i": i, "pad": "x" * 40})
    found = last_state_record(path, match=lambda r: r.payload.get("machine") == "trainer-0")
    assert found is not None and found.state == "TRAIN"
    assert last_state_record(path).payload["i"] == 2999  # type: ignore[union-attr]
    assert last_state_record(path, match=lambda r: False) is None
    assert last_state_record(tmp_path / "missing.jsonl") is None
    assert read_state_log(tmp_path / "missing.jsonl") == []


def test_concurrent_appenders_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    logs = [StateLog(path) for _ in range(4)]

    def writer(n: int) -> None:
        for i in range(50):
            logs[n].append(f"W{n}", {"i": i, "pad": "y" * 300})

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    for log in logs:
        log.close()
    records = read_state_log(path)
    assert len(records) == 200
    for n in range(4):
        assert [r.payload["i"] for r in records if r.state == f"W{n}"] == list(range(50))


@pytest.mark.parametrize(
    ("state", "payload", "message"),
    [
        ("", None, "non-empty single-line"),
        ("  ", None, "non-empty single-line"),
        ("A\nB", None, "non-empty single-line"),
        (3, None, "got 3"),
        ("A", ["list"], "payload must be a mapping"),
        ("A", {"x": object()}, "not JSON-serializable"),
        ("A", {"x": float("inf")}, "not JSON-serializable"),
    ],
)
def test_bad_input_writes_nothing(
    tmp_path: Path, state: object, payload: object, message: str
) -> None:
    path = tmp_path / "s.jsonl"
    with StateLog(path) as log:
        log.append("OK")
        before = path.read_bytes()
        with pytest.raises(StateLogError, match=message) as info:
            log.append(state, payload)  # type: ignore[arg-type]
        assert isinstance(info.value, RecoveryError)
        assert log.appends == 1
    assert path.read_bytes() == before


def test_closed_log_and_bad_arguments(tmp_path: Path) -> None:
    log = StateLog(tmp_path / "s.jsonl")
    log.close()
    log.close()
    with pytest.raises(StateLogError, match="closed"):
        log.append("A")
    with pytest.raises(StateLogError, match="lock_timeout"):
        StateLog(tmp_path / "t.jsonl", lock_timeout=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StateLogError, match="cannot open state log"):
        StateLog(tmp_path / "file" / "s.jsonl")


@pytest.mark.parametrize(("room", "expected"), [(0, "cannot append"), (7, "short write")])
def test_failing_append_leaves_no_partial_line(tmp_path: Path, room: int, expected: str) -> None:
    """A file-size limit in a child process makes the write fail or come up short."""
    import os
    import resource
    import signal

    path = tmp_path / "s.jsonl"
    with StateLog(path) as log:
        log.append("A")
    before = path.read_bytes()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + room, resource.RLIM_INFINITY))
        message = b"no error"
        try:
            with StateLog(path) as child_log:
                child_log.append("B", {"pad": "x" * 100})
        except StateLogError as exc:
            message = str(exc).encode()
        os.write(write_fd, message[:500])
        os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    message = os.read(read_fd, 1000).decode()
    os.close(read_fd)
    assert expected in message, message
    assert path.read_bytes() == before
    assert [r.state for r in read_state_log(path)] == ["A"]
