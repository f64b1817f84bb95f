"""Several processes and threads on one log: shared fsyncs, lock timeouts, killed holders."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from recovery.errors import RecoveryTimeout
from recovery.wal import WALError, WALLockTimeout, WriteAheadLog

# The on-disk record format, on purpose: these tests read, cut and forge segment bytes.
from recovery.wal._format import scan

# White-box: the shared state of the log is also tested on its own.
from recovery.wal._futex import SharedCounter
from recovery.wal._locks import SharedState

pytestmark = pytest.mark.timeout(120)

# spawn, not fork: the pytest worker may hold other tests' threads (UCX, listeners), and a
# child forked while one of them holds a lock waits on it forever (CI: a writer never finished)
_CTX = multiprocessing.get_context("spawn")


def _writer(
    directory: str, writer: int, threads: int, per_thread: int, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    wal = WriteAheadLog(directory)
    errors: list[str] = []  # a thread's exception, sent back: a child's stderr may be lost

    def run(thread: int) -> None:
        try:
            for i in range(per_thread):
                entry_id = f"p{writer}-t{thread}-{i}"
                wal.append(entry_id, "generate")
                wal.update_status(entry_id, "completed" if i % 2 else "executing")
        except BaseException as exc:
            errors.append(f"writer {writer} thread {thread}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stats = wal.stats()
    wal.close()
    out.put((stats.records, stats.fsyncs, errors))


def test_processes_and_threads_share_fsyncs(tmp_path: Path) -> None:
    WriteAheadLog(tmp_path).close()
    out: multiprocessing.Queue = _CTX.Queue()  # type: ignore[type-arg]
    procs = [_CTX.Process(target=_writer, args=(str(tmp_path), w, 4, 25, out)) for w in range(4)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=100) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    assert [e for _, _, errors in results for e in errors] == []
    records = sum(r for r, _, _ in results)
    fsyncs = sum(f for _, f, _ in results)
    with WriteAheadLog(tmp_path) as wal:  # what the log holds, before the handles' own counts
        assert len({e.entry_id for e in wal.entries()}) == 400
    assert records == 4 * 4 * 25 * 2
    # 16 concurrent appenders: one fsync must regularly cover several records
    assert fsyncs < records / 2, f"{fsyncs} fsyncs for {records} records"
    with WriteAheadLog(tmp_path) as wal:
        entries = {e.entry_id: e.status.value for e in wal.entries()}
    assert len(entries) == 400
    assert entries["p3-t2-7"] == "completed" and entries["p0-t0-0"] == "executing"


def _hold_lock(path: str, ready: multiprocessing.Event, seconds: float) -> None:  # type: ignore[type-arg]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as any other process holding the log's lock would
    ready.set()
    time.sleep(seconds)


def test_lock_wait_times_out_with_a_clear_error(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, lock_timeout=0.3)
    ready = _CTX.Event()
    holder = _CTX.Process(target=_hold_lock, args=(str(tmp_path / "append.lock"), ready, 30))
    holder.start()
    try:
        assert ready.wait(10)
        started = time.monotonic()
        with pytest.raises(WALLockTimeout, match="append.lock") as info:
            wal.append("a", "generate")
        assert isinstance(info.value, RecoveryTimeout)
        assert 0.25 < time.monotonic() - started < 5
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # type: ignore[arg-type]
        holder.join(10)
    wal.append("a", "generate")  # the kernel dropped the dead holder's flock
    assert wal.get("a") is not None
    wal.close()


def test_waiter_gets_a_lock_whose_holder_was_killed(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    ready = _CTX.Event()
    holder = _CTX.Process(target=_hold_lock, args=(str(tmp_path / "sync.lock"), ready, 30))
    holder.start()
    assert ready.wait(10)
    killer = threading.Timer(0.2, lambda: os.kill(holder.pid, signal.SIGKILL))  # type: ignore[arg-type]
    killer.start()
    started = time.monotonic()
    wal.append("a", "generate")  # must wait for the sync lock, then fsync itself
    waited = time.monotonic() - started
    killer.join()
    holder.join(10)
    assert 0.15 < waited < 5, waited
    assert wal.stats().fsyncs == 1
    wal.close()


def test_shared_counter_wakes_a_sleeper_in_another_process(tmp_path: Path) -> None:
    state = SharedState(tmp_path / "wal.state")
    counter: SharedCounter = state.sync_released
    seen = counter.value()

    def bump_later() -> None:
        time.sleep(0.1)
        other = SharedState(tmp_path / "wal.state")
        other.sync_released.bump_and_wake()
        other.close()
        os._exit(0)

    pid = os.fork()
    if pid == 0:
        bump_later()
    started = time.monotonic()
    counter.wait_while(seen, 5.0)
    assert time.monotonic() - started < 2.0
    assert counter.value() != seen
    os.waitpid(pid, 0)
    started = time.monotonic()
    counter.wait_while(counter.value(), 0.05)  # nobody wakes it: the timeout does
    assert 0.04 < time.monotonic() - started < 1.0
    state.close()


def _appender_during_compaction(
    directory: str, writer: int, n: int, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    wal = WriteAheadLog(directory, segment_bytes=2048)
    for i in range(n):
        entry_id = f"p{writer}-{i}"
        wal.append(entry_id, "reward")
        wal.update_status(entry_id, "failed" if i % 3 == 0 else "executing")
        if i % 5 == 0:
            wal.append(f"p{writer}-{i}-done", "update")
            wal.update_status(f"p{writer}-{i}-done", "completed")
    out.put(len(wal.recover()))
    wal.close()


def test_compaction_while_other_processes_append(tmp_path: Path) -> None:
    compactor = WriteAheadLog(tmp_path, segment_bytes=2048)
    out: multiprocessing.Queue = _CTX.Queue()  # type: ignore[type-arg]
    procs = [
        _CTX.Process(target=_appender_during_compaction, args=(str(tmp_path), w, 60, out))
        for w in range(3)
    ]
    for proc in procs:
        proc.start()
    compactions = 0
    while any(proc.is_alive() for proc in procs):
        compactor.compact()
        compactions += 1
        time.sleep(0.005)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    seen_by_writers = [out.get(timeout=10) for _ in procs]
    assert compactions > 3
    assert all(n >= 60 for n in seen_by_writers)  # each saw at least its own live entries
    compactor.compact()
    expected = {
        f"p{w}-{i}": ("failed" if i % 3 == 0 else "executing") for w in range(3) for i in range(60)
    }
    assert {e.entry_id: e.status.value for e in compactor.entries()} == expected
    compactor.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert {e.entry_id: e.status.value for e in reopened.recover()} == expected
    assert len(list(tmp_path.glob("wal-*.log"))) == 1


@pytest.mark.parametrize("room", [0, 10, 300])
def test_a_failing_write_is_a_wal_error_and_leaves_the_log_intact(
    tmp_path: Path, room: int
) -> None:
    """A file-size limit makes the zero-filling of new space fail (EFBIG) at once, after a
    part, or after room for a record but not for the space ahead, in a child process: a
    clear WALError, no partial record and no added bytes are left behind."""
    with WriteAheadLog(tmp_path) as wal:
        wal.append("before", "generate")
    segment = next(tmp_path.glob("wal-*.log"))
    # Cut the preallocated zeros, so that the next record needs new space.
    segment.write_bytes(segment.read_bytes()[: scan(segment.read_bytes()).valid_end])
    before = segment.read_bytes()
    expected = "cannot write to WAL"
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        import resource

        os.close(read_fd)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + room, resource.RLIM_INFINITY))
        message = b"no error"
        try:
            with WriteAheadLog(tmp_path) as child_wal:
                child_wal.append("too-big", "generate")
        except WALError as exc:
            message = f"{type(exc).__name__}: {exc}".encode()
        os.write(write_fd, message[:500])
        os._exit(0)
    os.close(write_fd)
    _, status = os.waitpid(pid, 0)
    message = os.read(read_fd, 1000).decode()
    os.close(read_fd)
    assert status == 0
    assert message.startswith(f"WALError: {expected}"), message
    assert segment.read_bytes() == before
    with WriteAheadLog(tmp_path) as wal:
        assert [e.entry_id for e in wal.entries()] == ["before"]
        wal.append("after", "generate")
