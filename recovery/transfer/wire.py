"""The transfer protocol's framing, independent of the transport underneath.

Every message is sent as two parts (an 8-byte length, then the body) and read as two receives of
exactly those sizes, so the same framing works over a byte stream (tcp) and over a message
transport where each receive must match one send (ucx). Chunk data follows a fixed 13-byte chunk
header and is received straight into the receiver's tensor memory.

A head and the body it announces go through the channel in one call (``send_parts``,
``recv_each``), and a stream of them in one ``recv_each``: on ucx every call is a hand-off to the
transport's event-loop thread and back, and the receives of a stream are posted ahead of its
messages (a message can only move once its receive is posted there).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from recovery.transfer.errors import ProtocolError

MAX_MESSAGE_BYTES = 64 << 20
_LENGTH = struct.Struct(">Q")
CHUNK_HEADER = struct.Struct(">IBQ")  # chunk index, status, payload length

# Chunk statuses: anything but OK ends the stream.
CHUNK_OK = 0
CHUNK_SOURCE_GAVE_UP = 1  # the source dropped the version (it was aborted or its own pull failed)
CHUNK_NOT_READY = 2  # a partial relay did not get the chunk in time
CHUNK_UNKNOWN = 3  # the source does not hold the version


class Channel(Protocol):
    """A connected, bidirectional channel to one peer; every call takes a timeout in seconds."""

    peer: str

    def send(self, data: bytes | memoryview, *, timeout: float) -> None:
        """Send all of ``data``; raises PeerDeadError / TransferTimeout."""
        ...

    def recv_into(self, buffer: memoryview, *, timeout: float) -> None:
        """Fill all of ``buffer``; raises PeerDeadError / TransferTimeout."""
        ...

    def send_parts(self, parts: Sequence[bytes | memoryview], *, timeout: float) -> None:
        """Send ``parts`` in order, each as if by its own :meth:`send` (the peer receives each
        with its own receive), in one call."""
        ...

    def recv_each(
        self,
        heads: Sequence[memoryview],
        body_for: Callable[[int, memoryview], memoryview | None],
        *,
        timeout: float,
    ) -> Iterator[int]:
        """Receive items in order: head ``i`` into ``heads[i]``, then the buffer
        ``body_for(i, head)`` names, if any; yields ``i`` once item ``i`` has landed, in order.
        ``body_for`` may run on another thread (the transport's); what it raises is raised here
        after the items before it were yielded, and then nothing more is received. ``timeout``
        bounds each wait for a message's progress, not the whole stream."""
        ...

    def close(self) -> None:
        """Release the connection (idempotent)."""
        ...


def send_message(channel: Channel, message: dict[str, Any], *, timeout: float) -> None:
    """Send one JSON message."""
    body = json.dumps(message, separators=(",", ":")).encode()
    channel.send_parts((_LENGTH.pack(len(body)), body), timeout=timeout)


def recv_message(channel: Channel, *, timeout: float) -> dict[str, Any]:
    """Receive one JSON message (a dict), refusing oversized or malformed ones."""
    head = bytearray(_LENGTH.size)
    body = bytearray()  # replaced by one of the announced length

    def body_for(_i: int, head: memoryview) -> memoryview | None:
        nonlocal body
        (length,) = _LENGTH.unpack(head)
        if length > MAX_MESSAGE_BYTES:
            raise ProtocolError(
                f"{channel.peer} announced a {length}-byte message (max {MAX_MESSAGE_BYTES})"
            )
        body = bytearray(length)
        return memoryview(body) if length else None

    # A stream of one item: iterating it is what receives it.
    for _ in channel.recv_each((memoryview(head),), body_for, timeout=timeout):
        pass
    try:
        message = json.loads(body)
    except ValueError as exc:
        raise ProtocolError(f"{channel.peer} sent a message that is not JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"{channel.peer} sent a JSON {type(message).__name__}, not an object")
    return message


def pack_chunk_header(index: int, status: int, length: int) -> bytes:
    """Header that precedes every chunk in a chunk stream."""
    return CHUNK_HEADER.pack(index, status, length)


def unpack_chunk_header(head: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(index, status, payload length) of a chunk header."""
    index, status, length = CHUNK_HEADER.unpack(head)
    return int(index), int(status), int(length)
