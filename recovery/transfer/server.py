"""Serves the versions in a :class:`WeightStore` to peers, over any :class:`Transport`.

Requests: ``manifest`` (the manifest plus transport extras), ``chunks`` (a list of chunk indices,
answered as a stream of chunk headers, each followed by its bytes on inline transports), ``stats``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from recovery.transfer.errors import PeerDeadError, TransferConfigError, TransferError
from recovery.transfer.ratelimit import SLICE_BYTES, EgressLimiter
from recovery.transfer.store import ServedVersion, WeightStore
from recovery.transfer.transport import Listener, Transport
from recovery.transfer.wire import (
    CHUNK_NOT_READY,
    CHUNK_OK,
    CHUNK_SOURCE_GAVE_UP,
    CHUNK_UNKNOWN,
    Channel,
    pack_chunk_header,
    recv_message,
    send_message,
)

log = logging.getLogger("rlguard.recovery.transfer.server")

# Chunks ready to go are sent in channel calls of up to this many bytes: on ucx a call is a
# hand-off to its event-loop thread and back, once per few chunks instead of once per chunk.
BATCH_BYTES = 16 << 20


class WeightServer:
    """Answers manifest and chunk requests for the versions in ``store``.

    ``egress_bytes_per_s`` caps this server's total send rate (all peers together), standing in
    for a network link where ``tc`` cannot be used. ``chunk_wait_timeout`` bounds how long a
    partial relay waits for a chunk it has not received yet.
    """

    def __init__(
        self,
        store: WeightStore,
        transport: Transport,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        egress_bytes_per_s: float | None = None,
        idle_timeout: float = 300.0,
        send_timeout: float = 30.0,
        chunk_wait_timeout: float = 60.0,
    ) -> None:
        for label, value in (
            ("idle_timeout", idle_timeout),
            ("send_timeout", send_timeout),
            ("chunk_wait_timeout", chunk_wait_timeout),
        ):
            if not value > 0:
                raise TransferConfigError(f"{label} must be positive, got {value!r}")
        self.store = store
        self.transport = transport
        self._limiter = EgressLimiter(egress_bytes_per_s) if egress_bytes_per_s else None
        self._idle_timeout = idle_timeout
        self._send_timeout = send_timeout
        self._chunk_wait_timeout = chunk_wait_timeout
        self._closed = threading.Event()
        self._listener: Listener = transport.listen(host, port, self._handle)
        self.address = self._listener.address

    def set_egress_limit(self, bytes_per_s: float | None) -> None:
        """Cap (or with None, uncap) this server's total send rate from now on."""
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise TransferConfigError(f"bytes_per_s must be positive or None, got {bytes_per_s!r}")
        self._limiter = EgressLimiter(bytes_per_s) if bytes_per_s else None

    def close(self) -> None:
        """Stop serving; open streams end."""
        self._closed.set()
        self._listener.close()

    def _handle(self, channel: Channel) -> None:
        while not self._closed.is_set():
            try:
                request = recv_message(channel, timeout=self._idle_timeout)
            except PeerDeadError:
                return  # the peer left or stayed idle too long: nothing to answer
            try:
                self._answer(channel, request)
            except PeerDeadError as exc:
                log.info("peer left mid-answer", extra={"peer": channel.peer, "error": str(exc)})
                return
            except TransferError as exc:
                log.warning("bad request", extra={"peer": channel.peer, "error": str(exc)})
                return

    def _answer(self, channel: Channel, request: dict[str, Any]) -> None:
        op = request.get("op")
        if op == "stats":
            send_message(
                channel, {"ok": True, "stats": dict(self.store.stats())}, timeout=self._send_timeout
            )
            return
        name, version = request.get("name"), request.get("version")
        if (
            op not in ("manifest", "chunks")
            or not isinstance(name, str)
            or not isinstance(version, int)
        ):
            send_message(
                channel,
                {"ok": False, "error": "bad_request", "detail": f"cannot answer {request!r:.200}"},
                timeout=self._send_timeout,
            )
            return
        if op == "manifest":
            served = self.store.wait_for(name, version, timeout=self._chunk_wait_timeout)
            if served is None:
                reply: dict[str, Any] = {"ok": False, "error": "unknown_version"}
            else:
                reply = {
                    "ok": True,
                    "manifest": served.manifest.to_json(),
                    "extra": served.buffers.extra,
                }
            send_message(channel, reply, timeout=self._send_timeout)
            return
        served = self.store.get(name, version)
        ids = request.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            send_message(
                channel,
                {"ok": False, "error": "bad_request", "detail": "ids"},
                timeout=self._send_timeout,
            )
            return
        self._stream(channel, served, ids)

    def _stream(self, channel: Channel, served: ServedVersion | None, ids: list[int]) -> None:
        if served is None:
            channel.send(pack_chunk_header(0, CHUNK_UNKNOWN, 0), timeout=self._send_timeout)
            return
        inline = self.transport.inline_payload
        # The headers and bytes of chunks ready now, sent in one channel call (on ucx, one
        # hand-off to the event-loop thread for up to BATCH_BYTES instead of one per chunk).
        batch = _Batch(channel, served, self._send_timeout)
        for index in ids:
            if not 0 <= index < len(served.views):
                batch.flush()
                channel.send(pack_chunk_header(index, CHUNK_UNKNOWN, 0), timeout=self._send_timeout)
                return
            outcome = served.wait_ready(index, timeout=0)
            if outcome == "timeout":  # what is ready goes out before waiting for the rest
                batch.flush()
                outcome = served.wait_ready(index, timeout=self._chunk_wait_timeout)
            if outcome != "ready":
                batch.flush()
                status = CHUNK_SOURCE_GAVE_UP if outcome == "dropped" else CHUNK_NOT_READY
                channel.send(pack_chunk_header(index, status, 0), timeout=self._send_timeout)
                return
            view = served.views[index]
            header = pack_chunk_header(index, CHUNK_OK, len(view))
            if self._limiter is None:
                # shm: the header alone (the reader copies the bytes), ready headers in one send
                batch.add(header, view if inline else None)
                continue
            if inline:
                self._send_paced(channel, header, view)
            else:
                # The reader copies the bytes itself; pacing readiness caps its read rate.
                if self._limiter is not None:
                    self._limiter.throttle(len(view))
                channel.send(header, timeout=self._send_timeout)
            served.count_served()
        batch.flush()

    def _send_paced(self, channel: Channel, header: bytes, view: memoryview) -> None:
        """A chunk's header and bytes under the egress limit: a byte stream in slices, so the
        pace is even; a message transport whole (each send must match one receive)."""
        assert self._limiter is not None
        if not self.transport.stream_oriented:
            self._limiter.throttle(len(view))
            channel.send_parts((header, view), timeout=self._send_timeout)
            return
        channel.send(header, timeout=self._send_timeout)
        for start in range(0, len(view), SLICE_BYTES):
            piece = view[start : start + SLICE_BYTES]
            self._limiter.throttle(len(piece))
            channel.send(piece, timeout=self._send_timeout)


class _Batch:
    """Ready chunks (header, bytes) waiting to go out in one ``send_parts`` call."""

    def __init__(self, channel: Channel, served: ServedVersion, timeout: float) -> None:
        self.channel, self.served, self.timeout = channel, served, timeout
        self.parts: list[bytes | memoryview] = []
        self.chunks = 0
        self.bytes = 0

    def add(self, header: bytes, view: memoryview | None) -> None:
        """A chunk's header, and its bytes unless the peer reads them itself (``None``)."""
        self.parts.append(header)
        self.chunks += 1
        if view is not None:
            self.parts.append(view)
            self.bytes += len(view)
        if self.bytes >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.parts:
            return
        self.channel.send_parts(self.parts, timeout=self.timeout)
        for _ in range(self.chunks):
            self.served.count_served()
        self.parts, self.chunks, self.bytes = [], 0, 0
