"""Raw client sockets for the slow-client tests: half-open connections from a chosen loopback
address (127.0.0.0/8 gives as many source addresses as a test needs), and reading what the
server sent until it closed them."""

from __future__ import annotations

import os
import selectors
import socket
import time

PARTIAL_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connect_from(source: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def half_open(port: int, n: int, source: str = "127.0.0.1") -> list[socket.socket]:
    """``n`` connections from ``source`` that each sent half a request and never finish it."""
    socks = []
    for _ in range(n):
        s = connect_from(source, port)
        try:
            s.sendall(PARTIAL_REQUEST)
        except (BrokenPipeError, ConnectionResetError):
            pass  # already closed by the server (to make room): read as such below
        socks.append(s)
    return socks


def read_until_closed(
    socks: list[socket.socket], timeout: float, *, expect_all: bool = True
) -> dict[socket.socket, bytes]:
    """Read the sockets until the server closes them (all of them, or what closed within
    ``timeout`` when ``expect_all`` is false); what each received, closed ones only."""
    got = {s: b"" for s in socks}
    closed: set[socket.socket] = set()
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except ConnectionResetError:
                    data = b""
                got[sock] += data
                if not data:
                    sel.unregister(sock)
                    closed.add(sock)
        if expect_all:
            assert not sel.get_map(), (
                f"{len(sel.get_map())} connections still open after {timeout} s"
            )
    finally:
        sel.close()
    return {s: got[s] for s in closed}


def still_open(socks: list[socket.socket]) -> list[socket.socket]:
    """Those of ``socks`` the server has not closed (nothing to read on them yet)."""
    sel = selectors.DefaultSelector()
    try:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        ready = {key.fileobj for key, _ in sel.select(timeout=0)}
    finally:
        sel.close()
    return [s for s in socks if s not in ready]


class RequestFlood:
    """``connections`` keep-alive clients sending ``GET path`` back to back from an event loop
    of their own, until :meth:`stop`; ``answered`` counts the responses read."""

    def __init__(self, port: int, *, connections: int, path: str = "/metrics") -> None:
        import asyncio
        import threading

        self.port, self.connections, self.path = port, connections, path
        self.answered = 0
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="request-flood", daemon=True)

    def start(self) -> RequestFlood:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), "the flood did not stop"

    def _run(self) -> None:
        import asyncio

        async def all_clients() -> None:
            await asyncio.gather(*(self._client() for _ in range(self.connections)))

        self._loop.run_until_complete(all_clients())
        self._loop.close()

    async def _client(self) -> None:
        import asyncio

        request = f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.05)  # the server stopped listening: the flood goes on
                continue
            try:
                while not self._stop.is_set():
                    writer.write(request)
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    )
                    await asyncio.wait_for(reader.readexactly(length), 5)
                    self.answered += 1
            except (OSError, asyncio.IncompleteReadError, TimeoutError, StopIteration):
                pass
            finally:
                writer.close()
