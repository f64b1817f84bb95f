"""``LoopFsync``: fsyncs on native threads, awaited on the event loop (app.ingest.commit.loop_fsync).

A FIFO stands in for a stalled disk: the native thread's ``open`` of it blocks until a writer
opens the other end, and ``fsync`` of a FIFO then fails with EINVAL, so one file gives both a
slow disk and a failing one, with no fake at the boundary.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.ingest.commit.loop_fsync import LoopFsync, native_fsync_available

pytestmark = pytest.mark.timeout(30)


def test_the_native_module_is_built() -> None:
    # setup.py builds it on every POSIX system with a C compiler, which CI has: were it missing,
    # the ingest committer would silently fall back to the slower thread path.
    assert native_fsync_available()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "stalled"
    os.mkfifo(path)
    yield path
    _has_reader(path)  # releases a native thread still blocked in open() (a failed test)


def _has_reader(path: Path) -> bool:
    """Whether something has the FIFO open for reading (a native thread blocked in its open
    counts, and is released by this check)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:  # ENXIO: no one has it open for reading
        return exc.errno != errno.ENXIO
    return True


def _release(path: Path) -> None:
    """Open the FIFO's write end: the native thread's open returns (and its fsync fails)."""
    os.close(os.open(path, os.O_WRONLY))


async def _until(condition: object, what: str) -> None:
    for _ in range(2000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_real_file_is_synced_and_its_path_returned(tmp_path: Path) -> None:
    f = tmp_path / "wal"
    f.write_bytes(b"frames")

    async def main() -> list[str]:
        syncer = LoopFsync()
        try:
            return [await syncer.fsync(str(f)) for _ in range(3)]
        finally:
            syncer.close()

    assert asyncio.run(main()) == [str(f)] * 3


def test_a_missing_file_syncs_the_fallback_or_names_the_missing_path(tmp_path: Path) -> None:
    db = tmp_path / "db"
    db.write_bytes(b"pages")
    missing = tmp_path / "db-wal"

    async def main() -> None:
        syncer = LoopFsync()
        try:
            assert await syncer.fsync(str(missing), fallback=str(db)) == str(db)
            with pytest.raises(FileNotFoundError) as info:
                await syncer.fsync(str(missing))
            assert info.value.filename == str(missing)
            with pytest.raises(FileNotFoundError) as info:
                await syncer.fsync(str(missing), fallback=str(tmp_path / "gone"))
            assert info.value.filename == str(tmp_path / "gone")  # the one tried last
        finally:
            syncer.close()

    asyncio.run(main())


def test_the_loop_runs_while_the_disk_stalls_and_a_failure_is_raised(fifo: Path) -> None:
    async def main() -> None:
        syncer = LoopFsync()
        try:
            pending = asyncio.ensure_future(syncer.fsync(str(fifo)))
            ticks = 0
            for _ in range(20):  # the loop is free: 20 turns of other work while it stalls
                await asyncio.sleep(0.005)
                ticks += 1
            assert ticks == 20 and not pending.done()
            await asyncio.to_thread(_release, fifo)
            with pytest.raises(OSError) as info:
                await pending
            assert info.value.errno == errno.EINVAL and info.value.filename == str(fifo)
        finally:
            syncer.close()

    asyncio.run(main())


def test_a_report_that_arrives_after_its_caller_gave_up_answers_no_one_else(
    fifo: Path, tmp_path: Path
) -> None:
    f = tmp_path / "wal"
    f.write_bytes(b"frames")

    async def main() -> None:
        syncer = LoopFsync()
        try:
            stalled = asyncio.ensure_future(syncer.fsync(str(fifo)))
            await asyncio.sleep(0.01)
            stalled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stalled
            assert await syncer.fsync(str(f)) == str(f)  # not the stalled one's report
            await asyncio.to_thread(_release, fifo)  # its EINVAL report now arrives ...
            await _until(lambda: syncer.late_reports == 1, "the stalled fsync's report")
            assert await syncer.fsync(str(f)) == str(f)  # ... was dropped, and the next works
            assert not syncer._pending  # noqa: SLF001
        finally:
            syncer.close()

    asyncio.run(main())


def test_close_while_a_sync_is_stalled_cancels_its_waiter(fifo: Path) -> None:
    async def main() -> None:
        syncer = LoopFsync()
        pending = asyncio.ensure_future(syncer.fsync(str(fifo)))
        await asyncio.sleep(0.01)
        syncer.close()
        with pytest.raises(asyncio.CancelledError):
            await pending
        # The native thread finishes later and reports to its own copy of the closed socket.
        await asyncio.to_thread(_release, fifo)
        await _until(lambda: not _has_reader(fifo), "the native thread to finish")

    asyncio.run(main())


def test_bad_input_is_refused_and_leaves_nothing_pending(tmp_path: Path) -> None:
    async def main() -> None:
        syncer = LoopFsync()
        try:
            with pytest.raises(ValueError, match="null"):
                await syncer.fsync(str(tmp_path / "a\0b"))
            with pytest.raises(TypeError):
                await syncer.fsync(42)  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="null"):
                await syncer.fsync(str(tmp_path / "x"), fallback="a\0b")
            assert not syncer._pending  # noqa: SLF001
        finally:
            syncer.close()

    asyncio.run(main())


def test_one_syncer_serves_one_event_loop(tmp_path: Path) -> None:
    f = tmp_path / "wal"
    f.write_bytes(b"frames")
    syncer = LoopFsync()

    async def once() -> str:
        return await syncer.fsync(str(f))

    asyncio.run(once())
    with pytest.raises(RuntimeError, match="event loop that first used it"):
        asyncio.run(once())
    syncer.close()
