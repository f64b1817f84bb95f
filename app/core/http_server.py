"""How uvicorn is started: limits that keep slow or numerous clients from taking the server,
and a shutdown that ends in bounded time (each limit's why: ``docs/deploy.md``).

- **a header deadline**: a request's headers must be complete within ``header_timeout_seconds``
  of the connection or of the request's first byte, or the client gets ``408`` and is
  disconnected. Bodies are bounded by a reverse proxy in front.
- **connections per client address** (``max_connections_per_client``): an address at its cap,
  or the server near its concurrency limit, closes its oldest connection still waiting for a
  request for a new one (``app.core.client_connections``); a new connection is refused (``429``)
  only when all of its address's connections are busy.
- **a concurrency limit**: beyond ``limit_concurrency`` connections or requests in progress, a
  request is answered ``503`` at once. The soft ``RLIMIT_NOFILE`` is raised to the hard limit.

On the first SIGTERM (or SIGINT) uvicorn waits ``graceful_shutdown_seconds`` for requests in
progress, and ``faulthandler``'s watchdog ends the process (every thread's stack to stderr,
status 1) ``shutdown_deadline_seconds`` after it, whatever the shutdown still waits for.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import resource
import sys
import threading
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from app.core.client_connections import ClientConnections
from app.core.config import ServerLimits
from app.core.forwarded import Network

log = logging.getLogger("rlguard.http")


def _plain_response(status: str, body: str, *extra_headers: str) -> bytes:
    encoded = body.encode()
    head = [
        f"HTTP/1.1 {status}",
        "content-type: text/plain",
        f"content-length: {len(encoded)}",
        *extra_headers,
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + encoded


_TIMEOUT_RESPONSE = _plain_response("408 Request Timeout", "request headers not received in time\n")
_MADE_ROOM_RESPONSE = _plain_response(
    "408 Request Timeout",
    "closed to make room for newer connections (from this address, or near the server's limit)\n",
)
# File descriptors the server needs besides client connections (database, broker, logs).
_SPARE_DESCRIPTORS = 256


class _GuardedConnection:
    """Mixed into uvicorn's HTTP protocol class (httptools or h11): both create ``self.cycle``
    when a request's headers are complete, parse only inside ``data_received`` and keep the
    server's open connections in ``self.connections``.

    Adds the header deadline and the per-address admission (``clients``, one table per
    server process)."""

    header_timeout: float
    clients: ClientConnections
    transport: asyncio.Transport
    cycle: Any
    connections: set[Any]

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._request_begun = False  # bytes of a request whose headers are not complete yet
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if not self.clients.admit(self, host):
            self._refuse(host)
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers():
            self._request_begun = True
            if self._header_timer is None:
                self._arm_header_timer()  # the first byte of the next request on this connection
        super().data_received(data)  # type: ignore[misc]
        if not self._awaiting_headers():
            self._request_begun = False
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        self.clients.forget(self)
        super().connection_lost(exc)  # type: ignore[misc]

    # -- as app.core.client_connections sees it ---------------------------------------------

    def waiting_for_request(self) -> bool:
        return not self.transport.is_closing() and self._awaiting_headers()

    def make_room(self) -> None:
        # Out of uvicorn's count now, not when the loop gets to connection_lost: its limit is
        # checked against that set when the newer connection's request arrives.
        self.connections.discard(self)
        self._cancel_header_timer()
        if self.cycle is None or self._request_begun:  # an idle keep-alive one goes quietly
            self.transport.write(_MADE_ROOM_RESPONSE)
        self.transport.close()

    # -- internals ------------------------------------------------------------------------------

    def _refuse(self, host: str | None) -> None:
        self.connections.discard(self)
        self.transport.write(
            _plain_response(
                "429 Too Many Requests",
                f"too many connections from {host} are busy (RLGUARD_SERVER__MAX_CONNECTIONS_"
                f"PER_CLIENT = {self.clients.per_client}); retry later\n",
                "retry-after: 1",
            )
        )
        self.transport.close()

    def _awaiting_headers(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm_header_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self.header_timeout, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return
        log.debug(
            "closing a connection whose request headers took over %.1f s", self.header_timeout
        )
        self.clients.forget(self)
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def http_protocol(limits: ServerLimits, uncapped: list[Network]) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn's "auto" picks) with the
    header deadline and the per-address cap (``uncapped``: the trusted proxies)."""
    base: type[asyncio.Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    clients = ClientConnections(
        per_client=limits.max_connections_per_client,
        total=limits.limit_concurrency,
        uncapped=uncapped,
    )
    return type(
        f"Guarded{base.__name__}",
        (_GuardedConnection, base),
        {"header_timeout": limits.header_timeout_seconds, "clients": clients},
    )


def raise_descriptor_limit(limits: ServerLimits) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; warn when even that is too low for the
    concurrency limit. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    if soft < limits.limit_concurrency + _SPARE_DESCRIPTORS:
        log.warning(
            "open-file limit %d is below RLGUARD_SERVER__LIMIT_CONCURRENCY (%d) + %d spare: a "
            "flood of connections can exhaust descriptors before the limit answers 503",
            soft,
            limits.limit_concurrency,
            _SPARE_DESCRIPTORS,
        )
    return soft


def uvicorn_options(limits: ServerLimits, uncapped: list[Network]) -> dict[str, Any]:
    """The keyword arguments for ``uvicorn.Config`` that enforce ``limits``."""
    return {
        "http": http_protocol(limits, uncapped),
        "limit_concurrency": limits.limit_concurrency,
        "timeout_keep_alive": limits.keep_alive_seconds,
        "timeout_graceful_shutdown": limits.graceful_shutdown_seconds,
    }


class _DeadlineServer(uvicorn.Server):
    """uvicorn's server whose first exit signal also arms the shutdown deadline."""

    def __init__(self, config: uvicorn.Config, deadline_seconds: float) -> None:
        super().__init__(config)
        self.deadline_seconds = deadline_seconds
        self._deadline_armed = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self._deadline_armed:
            self._deadline_armed = True
            try:
                faulthandler.dump_traceback_later(self.deadline_seconds, exit=True)
            except (RuntimeError, ValueError, AttributeError):  # no usable stderr to write to
                timer = threading.Timer(self.deadline_seconds, os._exit, args=(1,))
                timer.daemon = True
                timer.start()
            log.info("stopping; exiting in %.0f s at the latest", self.deadline_seconds)
        super().handle_exit(sig, frame)


def serve(
    app: str,
    *,
    host: str,
    port: int,
    limits: ServerLimits,
    uncapped: list[Network],
    **config: Any,
) -> None:
    """Serve the application factory ``app`` ("module:function") until SIGTERM or SIGINT,
    with ``limits``; ``config``: more ``uvicorn.Config`` arguments (log level, access log)."""
    server = _DeadlineServer(
        uvicorn.Config(
            app,
            factory=True,
            host=host,
            port=port,
            **config,
            **uvicorn_options(limits, uncapped),
        ),
        limits.shutdown_deadline_seconds,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:  # as uvicorn.run: the app or the socket failed at start
        sys.exit(STARTUP_FAILURE)
