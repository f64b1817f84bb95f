"""The transfer protocol's framing, independent of the transport underneath.

Every message is sent as two sends (an 8-byte length, then the body) and read as two receives of
exactly those sizes, so the same framing works over a byte stream (tcp) and over a message
transport where each receive must match one send (ucx). Chunk data follows a fixed 13-byte chunk
header and is received straight into the receiver's tensor memory.
"""

from __future__ import annotations

import json
import struct
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

    def close(self) -> None:
        """Release the connection (idempotent)."""
        ...


def send_message(channel: Channel, message: dict[str, Any], *, timeout: float) -> None:
    """Send one JSON message."""
    body = json.dumps(message, separators=(",", ":")).encode()
    channel.send(_LENGTH.pack(len(body)), timeout=timeout)
    channel.send(body, timeout=timeout)


def recv_message(channel: Channel, *, timeout: float) -> dict[str, Any]:
    """Receive one JSON message (a dict), refusing oversized or malformed ones."""
    head = bytearray(_LENGTH.size)
    channel.recv_into(memoryview(head), timeout=timeout)
    (length,) = _LENGTH.unpack(head)
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"{channel.peer} announced a {length}-byte message (max {MAX_MESSAGE_BYTES})")
    body = bytearray(length)
    if length:
        channel.recv_into(memoryview(body), timeout=timeout)
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


def recv_chunk_header(channel: Channel, *, timeout: float) -> tuple[int, int, int]:
    """Read one chunk header: (index, status, payload length)."""
    head = bytearray(CHUNK_HEADER.size)
    channel.recv_into(memoryview(head), timeout=timeout)
    index, status, length = CHUNK_HEADER.unpack(head)
    return int(index), int(status), int(length)
