"""Connections per client address (issue 41 item 4) against a real `rlguard server`.

Half-open connections from one address (127.0.0.1) never take more than that address's cap:
its oldest half-open ones are closed (408) as it opens more, and ``/healthz`` and ``/readyz``
keep answering at once, from another address (127.0.0.2) and from the flooding address itself.
An address whose connections are all busy with requests gets 429 for one more, others do not.
Loopback's 127.0.0.0/8 provides the source addresses. (benchmarks/slowloris.py measures 1,200.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlmodel import Session

from app.auth.tokens import create_node_token
from app.core import migrate
from tests.harness import free_port, wait_for

from ._procs import clean_env, healthy, rlguard
from ._sockets import connect_from, half_open, open_fds, read_until_closed, still_open

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CAP = 50
FLOOD = 400


class Server:
    def __init__(self, url: str, pid: int, token: str) -> None:
        self.url, self.pid, self.token = url, pid, token
        self.port = int(url.rsplit(":", 1)[1])

    def get(self, path: str, source: str) -> tuple[int, float]:
        """Status and seconds of one GET on a new connection from ``source``."""
        started = time.monotonic()
        with httpx.Client(transport=httpx.HTTPTransport(local_address=source)) as client:
            status = client.get(self.url + path, timeout=5).status_code
        return status, time.monotonic() - started


@pytest.fixture(scope="module")
def capped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a header timeout far beyond the test (the cap, not the deadline, must be
    what closes the flood) and RLGUARD_SERVER__MAX_CONNECTIONS_PER_CLIENT=50."""
    tmp_path: Path = tmp_path_factory.mktemp("capped")
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
        RLGUARD_POLICY_SCHEDULER="0",
        RLGUARD_SERVER__MAX_CONNECTIONS_PER_CLIENT=str(CAP),
    )
    log = tmp_path / "server.log"
    with rlguard(["server", "--port", str(port), "--header-timeout", "120"], env, log) as proc:
        base = f"http://127.0.0.1:{port}"
        healthy(base, proc, log)
        yield Server(base, proc.pid, token)


def test_half_open_flood_from_one_address_keeps_only_its_cap_and_probes_answer(
    capped_server: Server,
) -> None:
    server = capped_server
    baseline = open_fds(server.pid)
    socks = half_open(server.port, FLOOD, source="127.0.0.1")
    try:
        wait_for(lambda: len(still_open(socks)) <= CAP, 15, "the flood to be cut to the cap")
        assert open_fds(server.pid) <= baseline + CAP + 5
        for path in ("/healthz", "/readyz"):
            for source in ("127.0.0.2", "127.0.0.1"):  # elsewhere, and the flooder's address
                status, took = server.get(path, source)
                assert status == 200 and took < 2.0, (path, source, status, took)
        # The ones kept are the newest; each of the others was told why it was closed.
        kept = still_open(socks)
        assert set(kept) <= set(socks[-CAP - 10 :])
        closed = read_until_closed([s for s in socks if s not in kept], 10)
        assert len(closed) >= FLOOD - CAP
        assert all(
            data.startswith(b"HTTP/1.1 408 ") and b"make room" in data for data in closed.values()
        )
    finally:
        for s in socks:
            s.close()
    wait_for(lambda: open_fds(server.pid) <= baseline + 5, 10, "the server's sockets to go")


def busy_ingest(server: Server, source: str) -> socket.socket:
    """A request in progress: ingest's headers, then a body that never ends."""
    s = connect_from(source, server.port)
    s.sendall(
        b"POST /api/v1/ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {server.token}\r\n".encode()
        + b"Content-Length: 100000\r\n\r\n{"
    )
    return s


def test_an_address_whose_connections_are_all_busy_is_refused_and_others_are_not(
    capped_server: Server,
) -> None:
    server = capped_server
    busy = [busy_ingest(server, "127.0.0.3") for _ in range(CAP)]
    try:
        refused = connect_from("127.0.0.3", server.port)
        got = read_until_closed([refused], 5)[refused]
        assert got.startswith(b"HTTP/1.1 429 "), got
        assert b"too many connections from 127.0.0.3" in got
        assert b"RLGUARD_SERVER__MAX_CONNECTIONS_PER_CLIENT = 50" in got
        assert still_open(busy) == busy  # nobody busy was closed to make room
        status, took = server.get("/healthz", "127.0.0.4")
        assert status == 200 and took < 2.0
    finally:
        for s in busy:
            s.close()
    wait_for(lambda: server.get("/healthz", "127.0.0.3")[0] == 200, 10, "127.0.0.3 served again")
