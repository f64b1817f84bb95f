"""Write combining: threads of one process whose calls are written together by one of them."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from recovery.wal import WALError, WALLockTimeout, WALStatus, WriteAheadLog

# White-box: the queue that combines the calls of threads is also tested on its own.
from recovery.wal._combine import Call, CallQueue

pytestmark = pytest.mark.timeout(120)

_CTX = multiprocessing.get_context("spawn")  # no inherited threads or locks


def _run_threads(count: int, target: object) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def body(n: int) -> None:
        try:
            barrier.wait(timeout=10)
            target(n)  # type: ignore[operator]
        except BaseException as exc:  # collected for the main thread
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return errors


def test_a_refused_call_fails_alone_and_its_batch_mates_are_written(tmp_path: Path) -> None:
    """16 threads append the same 8 ids at once: each id is accepted exactly once, every
    other call gets 'already in the log', and the log holds exactly the accepted ones."""
    wal = WriteAheadLog(tmp_path)
    outcomes: dict[int, list[str]] = {}

    def writer(n: int) -> None:
        results = outcomes.setdefault(n, [])
        for i in range(8):
            try:
                wal.append(f"shared-{i}", "generate")
                results.append("ok")
            except WALError as exc:
                assert "already in the log" in str(exc)
                results.append("refused")

    assert _run_threads(16, writer) == []
    accepted = sum(r.count("ok") for r in outcomes.values())
    refused = sum(r.count("refused") for r in outcomes.values())
    assert (accepted, refused) == (8, 16 * 8 - 8)
    assert [e.entry_id for e in wal.entries()] == [f"shared-{i}" for i in range(8)]
    assert wal.stats().records == 8
    wal.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert sorted(e.entry_id for e in reopened.entries()) == [f"shared-{i}" for i in range(8)]


def test_changes_of_one_entry_from_several_threads_apply_in_log_order(tmp_path: Path) -> None:
    """Threads append an entry and others change it while batches are being combined: the
    last acknowledged status in memory is the last one in the log after a reopen."""
    wal = WriteAheadLog(tmp_path)
    for i in range(20):
        wal.append(f"e{i}", "generate")

    def changer(n: int) -> None:
        for i in range(20):
            status = ["executing", "failed", "pending", "executing"][(n + i) % 4]
            wal.update_status(f"e{i}", status)

    assert _run_threads(8, changer) == []
    in_memory = {e.entry_id: e.status for e in wal.entries()}
    wal.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert {e.entry_id: e.status for e in reopened.entries()} == in_memory
    assert set(in_memory.values()) <= {WALStatus.EXECUTING, WALStatus.FAILED, WALStatus.PENDING}


def test_many_threads_share_writes_and_fsyncs(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)

    def writer(n: int) -> None:
        for i in range(30):
            wal.append(f"t{n}-{i}", "generate")
            wal.update_status(f"t{n}-{i}", "completed")

    assert _run_threads(12, writer) == []
    stats = wal.stats()
    assert stats.records == 12 * 30 * 2
    assert stats.fsyncs < stats.records / 2, stats
    assert wal.recover() == []
    wal.close()


def _hold_lock(path: str, ready: object, seconds: float) -> None:
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(seconds)


def test_queued_calls_time_out_and_write_nothing_while_the_lock_is_held(
    tmp_path: Path,
) -> None:
    """Another process holds the append lock: the combiner and the calls queued behind it
    all raise WALLockTimeout within about the timeout, and nothing is written."""
    wal = WriteAheadLog(tmp_path, lock_timeout=0.4)
    ready = _CTX.Event()
    holder = _CTX.Process(target=_hold_lock, args=(str(tmp_path / "append.lock"), ready, 30))
    holder.start()
    timeouts: list[float] = []
    try:
        assert ready.wait(10)

        def writer(n: int) -> None:
            started = time.monotonic()
            with pytest.raises(WALLockTimeout):
                wal.append(f"blocked-{n}", "generate")
            timeouts.append(time.monotonic() - started)

        assert _run_threads(6, writer) == []
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
    assert len(timeouts) == 6 and all(0.3 < t < 5 for t in timeouts), timeouts
    assert wal.entries() == []
    wal.append("after", "generate")
    assert [e.entry_id for e in wal.entries()] == ["after"]
    wal.close()


def test_a_failed_batch_write_fails_every_call_in_it_and_leaves_no_phantom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write of a combined batch fails (ENOSPC): every call in the batch raises a
    WALError, the in-memory index shows none of them, and later calls work again."""
    wal = WriteAheadLog(tmp_path)
    wal.append("before", "generate")
    real_pwrite, real_pwritev = os.pwrite, os.pwritev
    failing = threading.Event()
    failing.set()

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        if failing.is_set():
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    def pwritev(fd: int, buffers: list[bytes], offset: int, flags: int = 0) -> int:
        if failing.is_set():
            raise OSError(28, "No space left on device")
        return real_pwritev(fd, buffers, offset, flags)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "pwritev", pwritev)
    outcomes: list[str] = []

    def writer(n: int) -> None:
        with pytest.raises(WALError, match="cannot write to WAL") as info:
            wal.append(f"lost-{n}", "generate")
        outcomes.append(str(info.value))

    assert _run_threads(6, writer) == []
    assert len(outcomes) == 6
    assert [e.entry_id for e in wal.entries()] == ["before"]
    failing.clear()
    wal.append("after", "generate")
    wal.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert [e.entry_id for e in reopened.entries()] == ["before", "after"]


def test_call_queue_promotes_the_next_queued_call_and_runs_every_batch_once() -> None:
    """The queue itself, without a log: each call is written exactly once, in some batch,
    and made durable by the batch that wrote it."""
    published: list[int] = []
    queue = CallQueue(published.append, 10.0)
    written: list[list[int]] = []
    durable: list[int] = []
    lock = threading.Lock()

    def write_batch(batch: list[Call], deadline: float) -> int:
        time.sleep(0.002)  # long enough for other threads to queue behind
        with lock:
            written.append([c.record[0] for c in batch])
        for c in batch:
            c.result, c.position = c.record[0], (1, c.record[0])
        return len(written)

    def make_durable(token: int, deadline: float) -> None:
        with lock:
            durable.append(token)

    results: list[int] = []

    def caller(n: int) -> None:
        for i in range(5):
            value = n * 5 + i
            call = Call(bytes([value]), lambda: None, time.monotonic() + 10)
            results.append(queue.run(call, write_batch, make_durable))

    assert _run_threads(10, caller) == []
    assert sorted(results) == list(range(50))
    assert sorted(v for batch in written for v in batch) == list(range(50))
    assert sorted(durable) == list(range(1, len(written) + 1))
    assert len(written) < 50  # some batches held several calls
    # the calls in flight, as published for sync leaders: up to all 10 threads, back to 0
    assert max(published) > 1 and published[-1] == 0 and min(published) == 0
    assert len(published) == 2 * 50


def test_a_call_whose_combiner_never_finishes_gives_up_after_its_grace() -> None:
    """A combiner stuck in its batch write (it cannot be, short of a bug: all its waits are
    bounded) must not hold the other calls of its batch forever."""
    queue = CallQueue(lambda n: None, 0.2)
    release = threading.Event()
    first_writing = threading.Event()

    def write_batch(batch: list[Call], deadline: float) -> None:
        if batch[0].record == b"first":
            first_writing.set()
            time.sleep(0.1)  # the others queue meanwhile and form the next batch
        else:
            release.wait(10)  # the next batch's combiner hangs
        for c in batch:
            c.result, c.position = c.record, None

    def make_durable(token: object, deadline: float) -> None:
        raise AssertionError("nothing to make durable")

    outcomes: dict[bytes, tuple[object, float]] = {}

    def caller(record: bytes) -> None:
        call = Call(record, lambda: None, time.monotonic() + 0.3)
        try:
            outcomes[record] = (queue.run(call, write_batch, make_durable), time.monotonic())
        except WALLockTimeout as exc:
            outcomes[record] = (exc, time.monotonic())

    first = threading.Thread(target=caller, args=(b"first",))
    first.start()
    assert first_writing.wait(5)
    others = [threading.Thread(target=caller, args=(bytes([65 + n]),)) for n in range(3)]
    started = time.monotonic()
    for thread in others:
        thread.start()
    time.sleep(1.5)  # well past every deadline and grace
    gave_up = {k: v for k, v in outcomes.items() if isinstance(v[0], WALLockTimeout)}
    release.set()
    for thread in [first, *others]:
        thread.join(timeout=5)
    assert outcomes[b"first"][0] == b"first"
    # one of the three became the hanging combiner; the two it took gave up after 0.3 + 0.2 s
    assert len(gave_up) == 2, outcomes
    for exc, when in gave_up.values():
        assert "may or may not have been written" in str(exc)
        assert 0.4 < when - started < 1.5
