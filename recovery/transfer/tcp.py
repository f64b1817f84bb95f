"""The default transport: plain TCP sockets, ``recv_into`` straight into the receiver's tensors.

Chunk bytes are never staged in a Python buffer on either side: the server sends memoryviews of
its tensors and the client receives into memoryviews of its own preallocated tensors.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

from recovery.transfer.errors import PeerDeadError, TransferTimeout
from recovery.transfer.transport import ConnectionHandler, Transport, split_address

log = logging.getLogger("rlguard.recovery.transfer.tcp")

ACCEPT_POLL_S = 0.5

# Parts smaller than this are joined and sent together (chunk headers, message heads):
# a stream of shm chunk headers was one sendall each.
_COALESCE_BYTES = 4096


class TcpChannel:
    """A connected TCP socket speaking the :class:`recovery.transfer.wire.Channel` protocol.

    The socket stays in blocking mode with kernel timeouts (``SO_RCVTIMEO``/``SO_SNDTIMEO``)
    instead of Python's poll-then-recv timeout mode, and receives with ``MSG_WAITALL``: a whole
    chunk lands in one system call and one wake-up, which leaves CPU for verifying it.
    """

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._timeout: float | None = None
        sock.settimeout(None)
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # (tests use Unix socket pairs)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _set_timeout(self, timeout: float) -> None:
        if timeout != self._timeout:
            seconds = int(timeout)
            value = struct.pack("ll", seconds, int((timeout - seconds) * 1_000_000))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            self._timeout = timeout

    def send(self, data: bytes | memoryview, *, timeout: float) -> None:
        """Send everything; ``timeout`` bounds each wait for progress (a hung peer)."""
        self.send_parts((data,), timeout=timeout)

    def send_parts(self, parts: Sequence[bytes | memoryview], *, timeout: float) -> None:
        """Send ``parts`` back to back (a byte stream keeps no boundaries between them)."""
        try:
            self._set_timeout(timeout)
            small: list[bytes | memoryview] = []  # coalesced: one syscall for many headers
            for part in parts:
                if len(part) < _COALESCE_BYTES:
                    small.append(part)
                    continue
                if small:
                    self.sock.sendall(b"".join(small))
                    small = []
                self.sock.sendall(part)
            if small:
                self.sock.sendall(b"".join(small))
        except (TimeoutError, BlockingIOError) as exc:
            raise TransferTimeout(self.peer, f"no send progress for {timeout}s") from exc
        except OSError as exc:
            raise PeerDeadError(self.peer, f"send failed: {exc}") from exc

    def recv_into(self, buffer: memoryview, *, timeout: float) -> None:
        """Fill ``buffer``; ``timeout`` bounds each wait for progress (a hung peer)."""
        got, want = 0, len(buffer)
        try:
            self._set_timeout(timeout)
            while got < want:
                n = self.sock.recv_into(buffer[got:], want - got, socket.MSG_WAITALL)
                if n == 0:
                    raise PeerDeadError(self.peer, f"connection closed after {got}/{want} bytes")
                got += n
        except (TimeoutError, BlockingIOError) as exc:
            raise TransferTimeout(
                self.peer, f"no data for {timeout}s ({got}/{want} bytes received)"
            ) from exc
        except PeerDeadError:
            raise
        except OSError as exc:
            raise PeerDeadError(self.peer, f"receive failed: {exc}") from exc

    def recv_each(
        self,
        heads: Sequence[memoryview],
        body_for: Callable[[int, memoryview], memoryview | None],
        *,
        timeout: float,
    ) -> Iterator[int]:
        """Fill each head, then the buffer ``body_for(i, head)`` names, if any; yields ``i``
        once item ``i`` has landed (a byte stream needs no receive posted ahead)."""
        for i, head in enumerate(heads):
            self.recv_into(head, timeout=timeout)
            body = body_for(i, head)
            if body is not None:
                self.recv_into(body, timeout=timeout)
            yield i

    def close(self) -> None:
        """Close the socket (idempotent)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already disconnected: closing is all that is left to do
        self.sock.close()


class TcpListener:
    """Accept loop in a daemon thread; one handler thread per connection."""

    def __init__(self, host: str, port: int, handler: ConnectionHandler) -> None:
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(128)
        self._sock.settimeout(ACCEPT_POLL_S)
        bound_host, bound_port = self._sock.getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"
        self._handler = handler
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[TcpChannel] = set()
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"tcp-listener-{bound_port}", daemon=True
        )
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                raise
            channel = TcpChannel(conn, f"{peer[0]}:{peer[1]}")
            with self._lock:
                self._open.add(channel)
            threading.Thread(target=self._serve, args=(channel,), daemon=True).start()

    def _serve(self, channel: TcpChannel) -> None:
        try:
            self._handler(channel)
        finally:
            channel.close()
            with self._lock:
                self._open.discard(channel)

    def close(self) -> None:
        """Stop accepting and cut open connections, so their handlers end."""
        self._closed.set()
        self._sock.close()
        with self._lock:
            channels = list(self._open)
        for channel in channels:
            channel.close()
        self._thread.join(timeout=ACCEPT_POLL_S * 4)


class TcpTransport(Transport):
    """Plain sockets; works anywhere, including between network namespaces."""

    name: ClassVar[str] = "tcp"

    def listen(self, host: str, port: int, handler: ConnectionHandler) -> TcpListener:
        """Listen on ``host:port``."""
        return TcpListener(host, port, handler)

    def connect(self, address: str, *, timeout: float) -> TcpChannel:
        """Connect to ``address`` within ``timeout`` seconds."""
        host, port = split_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError as exc:
            raise TransferTimeout(address, f"connect took longer than {timeout}s") from exc
        except OSError as exc:
            raise PeerDeadError(address, f"connect failed: {exc}") from exc
        return TcpChannel(sock, address)
