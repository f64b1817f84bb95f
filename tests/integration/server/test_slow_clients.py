"""Slow and numerous clients against a real `rlguard server` on 127.0.0.1 (issue 17 item 4).

Half-open connections (a request whose headers never end) are answered 408 and closed after
the header timeout, while /healthz keeps answering; trickling bytes does not extend the
deadline; near the concurrency limit the oldest half-open connections make room (issue 41
item 4) instead of every request getting 503. The cap per client address is raised out of
the way here (test_connections_per_client.py tests it). Bounded: a few hundred sockets, header
timeouts of a few seconds.
"""

from __future__ import annotations

import selectors
import socket
import stat
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from app.core import migrate
from tests.harness import free_port, wait_for

from ._procs import clean_env, healthy, rlguard
from ._sockets import PARTIAL_REQUEST, half_open, open_fds, read_until_closed, still_open

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

HEADER_TIMEOUT = 4.0
LIMIT = 400


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """One `rlguard server` for the module: --header-timeout 4 --limit-concurrency 400."""
    tmp_path = tmp_path_factory.mktemp("server")
    db = tmp_path / "rlguard.db"
    migrate.upgrade(f"sqlite:///{db}")
    db.chmod(0o644)  # as `rlguard db upgrade` under the usual umask leaves it
    port = free_port()
    env = clean_env(
        RLGUARD_DEV="1",
        RLGUARD_DATA_DIR=str(tmp_path / "data"),
        RLGUARD_DATABASE_URL=f"sqlite:///{db}",
        RLGUARD_POLICY_SCHEDULER="0",
        RLGUARD_SERVER__MAX_CONNECTIONS_PER_CLIENT="100000",
    )
    log = tmp_path / "server.log"
    args = [
        "server",
        "--port",
        str(port),
        "--header-timeout",
        str(HEADER_TIMEOUT),
        "--limit-concurrency",
        str(LIMIT),
    ]
    with rlguard(args, env, log) as proc:
        url = f"http://127.0.0.1:{port}"
        healthy(url, proc, log)
        assert stat.S_IMODE(db.stat().st_mode) == 0o600  # `server` made the database private
        yield url, proc.pid


def test_half_open_connections_are_closed_and_healthz_keeps_answering(
    slow_server: tuple[str, int],
) -> None:
    url, pid = slow_server
    timeout, port = HEADER_TIMEOUT, int(url.rsplit(":", 1)[1])
    with ThreadPoolExecutor(1) as pool:
        baseline = open_fds(pid)
        trickled = pool.submit(trickle_until_closed, port, timeout)
        started = time.monotonic()
        socks = half_open(port, LIMIT - 100)  # below the concurrency limit
        try:
            for _ in range(5):
                assert httpx.get(url + "/healthz", timeout=5).status_code == 200
            # ...while all of them still hang (the machine opened them within the timeout):
            assert time.monotonic() - started < timeout, "too slow to test: raise the timeout"
            sel = selectors.DefaultSelector()
            for sock in socks:
                sel.register(sock, selectors.EVENT_READ)
            assert sel.select(timeout=0) == [], "a half-open connection was answered early"
            sel.close()
            got = read_until_closed(socks, timeout + 15)
            took = time.monotonic() - started
        finally:
            for sock in socks:
                sock.close()
        assert all(data.startswith(b"HTTP/1.1 408 ") for data in got.values())
        assert took >= timeout
        assert timeout <= trickled.result(30) < timeout + 5  # bytes do not extend the deadline
    wait_for(lambda: open_fds(pid) <= baseline + 5, 10, "the server's sockets to be released")
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200


def trickle_until_closed(port: int, timeout: float) -> float:
    """Send a header byte every 0.2 s until the server closes the connection; how long it took.

    Timed from before the connect: the server's deadline runs from its accept, which may come
    before ``create_connection`` returns here (timed after it, 3.999 s was once measured
    against a 4 s timeout)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(PARTIAL_REQUEST)
        sel = selectors.DefaultSelector()
        sel.register(s, selectors.EVENT_READ)
        try:
            while time.monotonic() - t0 < timeout + 10:
                if sel.select(timeout=0.2):  # readable: the 408, then end of file
                    while s.recv(4096):
                        pass
                    return time.monotonic() - t0
                try:
                    s.sendall(b"x")
                except (BrokenPipeError, ConnectionResetError):
                    return time.monotonic() - t0
        finally:
            sel.close()
    raise AssertionError("a trickling client kept its connection open")


def test_near_the_concurrency_limit_the_oldest_half_open_connections_make_room(
    slow_server: tuple[str, int],
) -> None:
    """Before issue 41, LIMIT half-open connections made every request 503 until the header
    timeout closed them; now the oldest of them are closed (408) to keep the total under the
    limit, and requests are served."""
    url, pid = slow_server
    port = int(url.rsplit(":", 1)[1])
    baseline = open_fds(pid)
    started = time.monotonic()
    socks = half_open(port, LIMIT + 50)
    try:
        assert time.monotonic() - started < HEADER_TIMEOUT - 1, (
            "too slow to test: raise the timeout"
        )
        for _ in range(5):
            r = httpx.get(url + "/healthz", timeout=5)
            assert r.status_code == 200, r.text
        kept, oldest = still_open(socks[-200:]), still_open(socks[:100])
        fds = open_fds(pid)
        # (all before the header timeout could have closed any of them)
        assert time.monotonic() - started < HEADER_TIMEOUT, "too slow to test: raise the timeout"
        assert len(kept) == 200  # the newest are kept...
        assert fds < baseline + LIMIT
        gone = [s for s in socks[:100] if s not in oldest]  # ...the oldest went
        made_room = read_until_closed(gone, 5)
        assert len(made_room) >= 50 and all(
            data.startswith(b"HTTP/1.1 408 ") and b"make room" in data
            for data in made_room.values()
        )
    finally:
        for s in socks:
            s.close()
