"""SIGTERM stops `rlguard server` within a bounded time under any load (issue 41 item 2).

Before: under a flood the application's shutdown, which has no deadline of its own (the ingest
committer, a policy tick in progress, the scheduler lease released through a locked database),
kept the process alive long after SIGTERM. Now the first SIGTERM arms a deadline
(``RLGUARD_SERVER__SHUTDOWN_DEADLINE_SECONDS``) after which the process writes every thread's
stack to stderr and exits with status 1.

Here: a real server with its policy scheduler, flooded with requests, holding half-open and
busy connections, its database write-locked by another process (each write of the shutdown
then waits out SQLite's 10 s busy timeout); SIGTERM; it must be gone within the deadline.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.core import migrate
from tests.harness import free_port, wait_for
from tests.harness.services import hold_write_lock

from ._procs import clean_env, healthy, rlguard
from ._sockets import RequestFlood, connect_from, half_open

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GRACE, DEADLINE = 2, 8.0
SLACK = 4.0  # a loaded machine's time to start the watchdog's exit and reap the process


@contextmanager
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, str, str, Path]]:
    db = tmp_path / "rlguard.db"
    url = f"sqlite:///{db}"
    migrate.upgrade(url)
    engine = sa.create_engine(url)
    with Session(engine) as s:
        _t, token = create_node_token(s, node="n1", actor="test")
        s.commit()
    engine.dispose()
    port = free_port()
    env = clean_env(
        RLGUARD_DEV="1",
        RLGUARD_DATA_DIR=str(tmp_path / "data"),
        RLGUARD_DATABASE_URL=url,
        RLGUARD_SERVER__GRACEFUL_SHUTDOWN_SECONDS=str(GRACE),
        RLGUARD_SERVER__SHUTDOWN_DEADLINE_SECONDS=str(DEADLINE),
    )
    log = tmp_path / "server.log"
    with rlguard(["server", "--port", str(port), "--header-timeout", "60"], env, log) as proc:
        healthy(f"http://127.0.0.1:{port}", proc, log)
        yield proc, port, token, url, log


def stopped_within(proc: subprocess.Popen[bytes], timeout: float) -> float:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server still runs {timeout:.0f} s after SIGTERM")
    return time.monotonic() - started


def test_sigterm_under_a_flood_and_a_locked_database_exits_by_the_deadline(
    tmp_path: Path,
) -> None:
    with server(tmp_path) as (proc, port, token, url, log):
        flood = RequestFlood(port, connections=40).start()
        held = half_open(port, 60, source="127.0.0.2") + half_open(port, 60, source="127.0.0.3")
        busy = []
        for _ in range(20):  # ingest requests whose bodies never end
            s = connect_from("127.0.0.4", port)
            s.sendall(
                b"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + b"Content-Length: 100000\r\n\r\n{"
            )
            busy.append(s)
        locked, release = threading.Event(), threading.Event()
        locker = threading.Thread(target=hold_write_lock, args=(url, locked, release))
        locker.start()
        try:
            assert locked.wait(15), "could not take the database's write lock"
            before = flood.answered
            wait_for(lambda: flood.answered >= before + 200, 30, "the flood to be answered")
            took = stopped_within(proc, DEADLINE + SLACK)
        finally:
            release.set()
            locker.join(30)
            flood.stop()
            for s in held + busy:
                s.close()
    assert DEADLINE - 0.5 <= took <= DEADLINE + SLACK, took
    assert proc.returncode == 1, proc.returncode  # the deadline ended it: shutdown was stuck
    text = log.read_text(errors="replace")
    assert "exiting in 8 s at the latest" in text
    assert "Timeout (0:00:08)!" in text and "Thread 0x" in text  # what was still running


def test_sigterm_without_load_is_a_clean_stop_well_before_the_deadline(tmp_path: Path) -> None:
    with server(tmp_path) as (proc, _port, _token, _url, log):
        took = stopped_within(proc, DEADLINE + SLACK)
    assert took < DEADLINE, took
    assert proc.returncode == -signal.SIGTERM  # uvicorn re-raises the signal once done
    assert "Timeout (" not in log.read_text(errors="replace")
