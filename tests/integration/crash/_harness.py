"""Run a child process, SIGKILL it at a random moment, and collect what it acknowledged.

The child is forked from the test process (fast: no interpreter start-up per kill) and
reports over a pipe *after* each call returned (``A ...``), announcing it first (``B ...``), so
the parent knows exactly which operations were acknowledged and which one may have been in
flight when the kill landed.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

_FIRST_REPORT_TIMEOUT_S = 30.0


class Reporter:
    """The child's side of the pipe."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def begin(self, op: str) -> None:
        """Announce an operation about to start."""
        self._send(f"B {op}\n")

    def ack(self, op: str) -> None:
        """Report an operation whose call has returned: the begun op, then any results."""
        self._send(f"A {op}\n")

    def _send(self, line: str) -> None:
        data = line.encode()
        assert len(data) < 512  # one write() of < PIPE_BUF bytes is atomic
        os.write(self._fd, data)


@dataclass
class ChildRun:
    """What one killed child reported."""

    acked: list[str] = field(default_factory=list)
    in_flight: str | None = None
    exit_status: int = 0
    error: str = ""


def run_and_kill(
    child: Callable[[Reporter], None],
    kill_after: float,
    *,
    while_running: Callable[[], None] | None = None,
    from_first_report: bool = True,
) -> ChildRun:
    """Fork, run ``child`` until it is SIGKILLed ``kill_after`` seconds later, collect reports.

    ``while_running`` is called repeatedly in the parent until the kill (a concurrent reader).
    """
    return run_many_and_kill(
        [child], [kill_after], while_running=while_running, from_first_report=from_first_report
    )[0]


def _fork_child(child: Callable[[Reporter], None]) -> tuple[int, int, int]:
    read_fd, write_fd = os.pipe()
    err_read, err_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        os.close(read_fd)
        os.close(err_read)
        status = 0
        try:
            child(Reporter(write_fd))
        except BaseException:
            os.write(err_write, traceback.format_exc().encode()[-4000:])
            status = 3
        os._exit(status)
    os.close(write_fd)
    os.close(err_write)
    return pid, read_fd, err_read


def run_many_and_kill(
    children: list[Callable[[Reporter], None]],
    kill_after: list[float],
    *,
    while_running: Callable[[], None] | None = None,
    from_first_report: bool = True,
) -> list[ChildRun]:
    """Run several children at once, SIGKILL each at its own time, collect their reports.

    With ``from_first_report`` the delays count from the moment every child has announced its
    first operation, so that on a loaded machine the kills still land inside the operations
    rather than during start-up; without it they count from the fork.
    """
    started = [_fork_child(child) for child in children]
    unreaped = {pid for pid, _, _ in started}
    early: dict[int, bytes] = {}
    stop = threading.Event()
    killer: threading.Thread | None = None
    try:
        if from_first_report:
            for pid, read_fd, _ in started:
                readable, _, _ = select.select([read_fd], [], [], _FIRST_REPORT_TIMEOUT_S)
                assert readable, f"child {pid} reported nothing within {_FIRST_REPORT_TIMEOUT_S}s"
                early[read_fd] = os.read(read_fd, 65536)
        schedule = sorted(
            zip([p for p, _, _ in started], kill_after, strict=True), key=lambda x: x[1]
        )
        # The kills run on a thread of their own, on time: a reader pass in ``while_running``
        # grows with what the child committed, and a kill that waited for it to end landed
        # later and later (more commits, a slower reader: a test that timed out on a slow
        # machine).
        killer = threading.Thread(
            target=_kill_on_time, args=(schedule, time.monotonic(), stop), daemon=True
        )
        killer.start()
        while killer.is_alive():
            if while_running is None:
                killer.join()
            else:
                while_running()
        runs = []
        for pid, read_fd, err_read in started:
            _, status = os.waitpid(pid, 0)
            unreaped.discard(pid)
            runs.append(_collect(read_fd, err_read, status, early.get(read_fd, b"")))
        return runs
    finally:
        stop.set()  # a killer still waiting (the reader failed) must not outlive the reaping
        if killer is not None:
            killer.join()
        for pid in unreaped:  # only children we have not reaped: their pid cannot be reused yet
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for _, read_fd, err_read in started:
            os.close(read_fd)
            os.close(err_read)


def _kill_on_time(schedule: list[tuple[int, float]], t0: float, stop: threading.Event) -> None:
    """SIGKILL each pid ``delay`` seconds after ``t0``, unless ``stop`` is set first."""
    for pid, delay in schedule:
        if stop.wait(max(0.0, t0 + delay - time.monotonic())):
            return
        os.kill(pid, signal.SIGKILL)


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _collect(read_fd: int, err_fd: int, status: int, early: bytes = b"") -> ChildRun:
    run = ChildRun(exit_status=status, error=_read_all(err_fd).decode(errors="replace"))
    for line in (early + _read_all(read_fd)).decode().splitlines():
        kind, _, op = line.partition(" ")
        if kind == "B":
            run.in_flight = op
        elif kind == "A":
            # an ack repeats the begun operation and may add what it returned
            assert run.in_flight is not None and (
                op == run.in_flight or op.startswith(run.in_flight + " ")
            ), f"ack {op!r} without its begin (last begin {run.in_flight!r})"
            run.acked.append(op)
            run.in_flight = None
    return run


def assert_killed(run: ChildRun) -> None:
    """The child must have died of our SIGKILL, not of an exception of its own."""
    assert not run.error, f"child failed before the kill:\n{run.error}"
    assert os.WIFSIGNALED(run.exit_status) and os.WTERMSIG(run.exit_status) == signal.SIGKILL, (
        f"child was not killed by SIGKILL (status {run.exit_status}); it stopped early"
    )
