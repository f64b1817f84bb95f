"""A WAL handle across fork and across threads at close().

A handle belongs to the process that opened it: flock locks live on the open file description
that parent and child share after fork, so an inherited handle would neither exclude the parent
nor leave its lock alone. These tests fork real children.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from recovery.wal import WALForkedError, WALLockTimeout, WriteAheadLog

pytestmark = pytest.mark.timeout(60)

_CTX = multiprocessing.get_context("fork")


def _in_child(body: Callable[[], object]) -> object:
    """Run ``body`` in a forked child; return what it returned, or its error as a string."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        try:
            out: object = {"ok": body()}
        except BaseException as exc:  # report everything, the parent asserts on it
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(out).encode())
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    result: object = json.loads(b"".join(chunks))
    return result


def test_every_call_on_an_inherited_handle_is_refused_in_the_child(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append("a", "generate")

    def child() -> list[str]:
        errors = []
        calls: list[Callable[[], object]] = [
            lambda: wal.append("from-child", "generate"),
            lambda: wal.update_status("a", "failed"),
            wal.recover,
            lambda: wal.get("a"),
            wal.entries,
            wal.compact,
        ]
        for call in calls:
            try:
                call()
                errors.append("no error")
            except WALForkedError as exc:
                errors.append(str(exc))
        wal.close()  # drops the child's copies only
        return errors

    errors = _in_child(child)["ok"]  # type: ignore[index]
    assert len(errors) == 6
    for message in errors:
        assert f"opened in process {os.getpid()}" in message
        assert "open a new WriteAheadLog in this process" in message
    # The parent's handle is untouched, and nothing from the child reached the log.
    wal.append("b", "reward")
    assert [e.entry_id for e in wal.entries()] == ["a", "b"]
    assert wal.get("a").status.value == "pending"  # type: ignore[union-attr]
    wal.close()


def _try_lock(path: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as another process's writer would
    except BlockingIOError:
        out.put(False)
    else:
        out.put(True)


def test_closing_an_inherited_handle_leaves_the_parents_lock_held(tmp_path: Path) -> None:
    """Before the fix, the child's close() took the flock (same open file description as the
    parent's, so it "succeeded" at once) and unlocked it: the parent lost its lock."""
    wal = WriteAheadLog(tmp_path)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.read(go_r, 1)  # wait until the parent holds the append lock
        started = time.monotonic()
        code = 0
        try:
            wal.close()
        except BaseException:
            code = 2
        os.write(done_w, f"{time.monotonic() - started:.3f}".encode())
        os._exit(code)
    wal._append_lock.acquire(5)  # the parent is in the middle of an append
    try:
        os.write(go_w, b"x")
        took = float(os.read(done_r, 64))
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert took < 1.0  # close() in the child never waits for the parent's lock
        out: multiprocessing.Queue = _CTX.Queue()  # type: ignore[type-arg]
        probe = _CTX.Process(target=_try_lock, args=(str(tmp_path / "append.lock"), out))
        probe.start()
        assert out.get(timeout=20) is False, "the parent's append lock was released by the child"
        probe.join(10)
    finally:
        wal._append_lock.release()
    for fd in (go_r, go_w, done_r, done_w):
        os.close(fd)
    wal.append("after", "generate")
    wal.close()


def test_a_child_with_its_own_handle_shares_the_log(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.append("parent-0", "generate")

    def child() -> int:
        own = WriteAheadLog(tmp_path)
        for i in range(20):
            own.append(f"child-{i}", "generate")
            own.update_status(f"child-{i}", "executing")
        seen = len(own.entries())
        own.close()
        return seen

    assert _in_child(child) == {"ok": 21}
    wal.append("parent-1", "generate")
    ids = [e.entry_id for e in wal.entries()]
    assert ids == ["parent-0", *[f"child-{i}" for i in range(20)], "parent-1"]
    wal.close()


@pytest.fixture()
def slow_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each group-commit fsync takes 0.3 s longer, so a commit is in flight long enough."""
    real = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.3)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow)
    yield


def test_close_waits_for_commits_other_threads_have_in_flight(
    tmp_path: Path, slow_fsync: None
) -> None:
    """Before the fix, close() pulled the descriptors and the mapping from under the leader's
    fsync (EBADF, and its waiters hung until their timeout)."""
    wal = WriteAheadLog(tmp_path, lock_timeout=10)
    errors: list[str] = []

    def append(i: int) -> None:
        try:
            wal.append(f"e{i}", "generate")
        except Exception as exc:  # collected and asserted below
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=append, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    started = time.monotonic()
    wal.close()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert time.monotonic() - started < 5
    with WriteAheadLog(tmp_path) as reopened:
        assert sorted(e.entry_id for e in reopened.entries()) == ["e0", "e1", "e2"]


def test_close_gives_up_after_lock_timeout_and_leaves_the_handle_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (time.sleep(1.0), real(fd)))
    wal = WriteAheadLog(tmp_path, lock_timeout=0.2)
    wal._timeout = 5.0  # the append itself may wait; only close() should give up early
    thread = threading.Thread(target=wal.append, args=("slow", "generate"))
    thread.start()
    time.sleep(0.1)
    wal._timeout = 0.2
    with pytest.raises(WALLockTimeout, match=r"not closed: 1 call\(s\) of other threads"):
        wal.close()
    thread.join(10)
    monkeypatch.setattr(os, "fdatasync", real)
    wal.append("after", "generate")  # still open
    wal.close()
    with WriteAheadLog(tmp_path) as reopened:
        assert [e.entry_id for e in reopened.entries()] == ["slow", "after"]


def test_a_counter_used_after_its_log_closed_names_the_problem(tmp_path: Path) -> None:
    from recovery.wal import WALClosedError

    # White-box: the shared state's counters, which a closed log must never touch again.
    from recovery.wal._locks import SharedState

    state = SharedState(tmp_path / "wal.state")
    counter = state.sync_released
    state.close()
    with pytest.raises(WALClosedError, match="used after the log was closed"):
        counter.bump_and_wake()
    with pytest.raises(WALClosedError, match="used after the log was closed"):
        counter.value()
