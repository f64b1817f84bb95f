"""How uvicorn is started: limits that keep slow or numerous clients from taking the server.

uvicorn closes an idle keep-alive connection, but not one that is still sending its request
headers: a client that connects and sends half a request line (or one byte every few seconds)
holds a socket forever, and some thousands of them exhausted the process's file descriptors
while ``/healthz`` stopped answering. So:

- **a header deadline**: a request's headers must be complete within ``header_timeout_seconds``
  of the connection being made or of the request's first byte; trickling bytes does not extend
  it. A late client gets ``408`` and the connection is closed. (Bodies are the application's
  to read; a reverse proxy in front bounds them, see docs/deploy.md.)
- **a concurrency limit**: beyond ``limit_concurrency`` open connections or requests in
  progress, a request is answered ``503`` at once (uvicorn's own ``limit_concurrency``) instead
  of waiting; half-open connections count, so a flood turns into quick 503s until the deadline
  has closed it.
- **file descriptors**: the soft ``RLIMIT_NOFILE`` is raised to the hard limit, so that the
  limit above, not ``accept()`` failing with EMFILE, is what a flood meets first.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from app.core.config import ServerLimits

log = logging.getLogger("rlguard.http")

_TIMEOUT_BODY = b"request headers not received in time\n"
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
    + f"content-length: {len(_TIMEOUT_BODY)}\r\n".encode()
    + b"connection: close\r\n\r\n"
    + _TIMEOUT_BODY
)
# File descriptors the server needs besides client connections (database, broker, logs).
_SPARE_DESCRIPTORS = 256


class _HeaderDeadline:
    """Mixed into uvicorn's HTTP protocol class (httptools or h11): both create ``self.cycle``
    when a request's headers are complete, and parse only inside ``data_received``."""

    header_timeout: float
    transport: asyncio.Transport
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self._awaiting_headers():
            self._arm_header_timer()  # the first byte of the next request on this connection
        super().data_received(data)  # type: ignore[misc]
        if self._header_timer is not None and not self._awaiting_headers():
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)  # type: ignore[misc]

    def _awaiting_headers(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm_header_timer(self) -> None:
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self.header_timeout, self._on_header_timeout)

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._awaiting_headers():
            return
        log.debug("closing a connection whose request headers took over %.1f s",
                  self.header_timeout)
        self.transport.write(_TIMEOUT_RESPONSE)
        self.transport.close()


def http_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools when installed, as uvicorn's "auto" picks) with the
    header deadline."""
    base: type[asyncio.Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = HttpToolsProtocol
    except ImportError:  # uvicorn without its [standard] extra
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return type(
        f"HeaderDeadline{base.__name__}",
        (_HeaderDeadline, base),
        {"header_timeout": header_timeout},
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
            soft, limits.limit_concurrency, _SPARE_DESCRIPTORS,
        )
    return soft


def uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """The keyword arguments for ``uvicorn.run`` that enforce ``limits``."""
    return {
        "http": http_protocol(limits.header_timeout_seconds),
        "limit_concurrency": limits.limit_concurrency,
        "timeout_keep_alive": limits.keep_alive_seconds,
    }
