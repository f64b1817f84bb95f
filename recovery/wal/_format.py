"""On-disk record format of the write-ahead log.

A segment is a plain sequence of records. Each record is a 12-byte header (magic ``RLW1``,
payload length, CRC-32 of length and payload) followed by a compact JSON payload. The CRC
covers the length field too, so a flipped length byte is caught instead of making the reader
jump to a wrong offset. A segment is scanned front to back; the scan stops at the first record
that does not decode and says whether a valid record follows it (corruption in the middle) or
not (a torn or corrupt tail).

The segment being written is preallocated with zeros ahead of the records (see
:mod:`recovery.wal`), and every record is written together with a zero header after it
(:data:`END_MARK`): a header of 12 zero bytes is the clean end of the log. Nothing after it is
read. A single flipped byte never turns a record's header into zeros (its magic has four
non-zero bytes), so damage inside the log is still reported, not taken for the end.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

MAGIC = b"RLW1"
HEADER = struct.Struct("<4sII")
#: Written right after every record: where the records stop (a zero header).
END_MARK = bytes(HEADER.size)
_LENGTH = struct.Struct("<I")
# A record holds ids, paths and checksums, never bulk data; anything longer than this is a
# damaged length field, not a real record.
MAX_PAYLOAD_BYTES = 1 << 20


def encode_record(payload: dict[str, Any]) -> bytes:
    """Frame ``payload`` as one record: header (magic, length, CRC) plus JSON bytes."""
    body = orjson.dumps(payload)
    if len(body) > MAX_PAYLOAD_BYTES:
        raise ValueError(f"WAL record payload of {len(body)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return HEADER.pack(MAGIC, len(body), _crc(len(body), body)) + body


def _crc(length: int, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(_LENGTH.pack(length)))


class DecodedRecord(NamedTuple):
    """One valid record found by a scan: its byte range and its payload."""

    offset: int
    end: int
    payload: dict[str, Any]


def decode_at(buf: bytes, offset: int, stop: int) -> DecodedRecord | str:
    """Decode the record starting at ``offset``; return it, or the reason it is invalid."""
    if stop - offset < HEADER.size:
        return f"{stop - offset} bytes left, shorter than a record header"
    magic, length, crc = HEADER.unpack_from(buf, offset)
    if magic != MAGIC:
        return f"bad magic {magic!r}"
    if length > MAX_PAYLOAD_BYTES:
        return f"length field {length} exceeds {MAX_PAYLOAD_BYTES}"
    start = offset + HEADER.size
    end = start + length
    if end > stop:
        return f"record of {length} payload bytes runs past the end ({stop - start} left)"
    body = memoryview(buf)[start:end]
    if _crc(length, body) != crc:
        return "checksum mismatch"
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return f"payload is not JSON ({exc})"
    if not isinstance(payload, dict):
        return f"payload is {type(payload).__name__}, not an object"
    return DecodedRecord(offset, end, payload)


@dataclass(frozen=True)
class ScanResult:
    """What a scan of one segment found.

    ``valid_end`` is the offset just past the last good record before any problem;
    ``problem`` describes the first undecodable record (None when the scan reached ``stop``
    or an end mark cleanly); ``resumes_at`` is the offset of a valid record found after the
    problem, which makes the problem corruption in the middle rather than a damaged tail;
    ``zero_tail`` says the scan stopped at an end mark (the bytes after it were not read).
    """

    records: list[DecodedRecord]
    valid_end: int
    problem: str | None = None
    resumes_at: int | None = None
    zero_tail: bool = False


def scan(buf: bytes, start: int = 0, stop: int | None = None) -> ScanResult:
    """Decode records in ``buf[start:stop]`` until the end, an end mark, or an invalid record.

    ``zero_tail`` in the result is True when the scan stopped at an end mark (zeros) before
    ``stop``; ``valid_end`` is then where the next record goes.
    """
    end = len(buf) if stop is None else stop
    records: list[DecodedRecord] = []
    view = memoryview(buf)
    unpack_header = HEADER.unpack_from
    header_size = HEADER.size
    crc32 = zlib.crc32
    loads = orjson.loads
    offset = start
    # Every process applies every record any process appends, so the common case (a whole,
    # valid record) is decoded inline; anything else goes through decode_at for its reason.
    while offset < end:
        if buf[offset] == 0 and is_end_mark(buf, offset, end):
            return ScanResult(records, offset, zero_tail=True)
        body_start = offset + header_size
        if body_start <= end:
            magic, length, crc = unpack_header(buf, offset)
            body_end = body_start + length
            if magic == MAGIC and length <= MAX_PAYLOAD_BYTES and body_end <= end:
                body = view[body_start:body_end]
                if crc32(body, crc32(view[offset + 4 : offset + 8])) == crc:
                    try:
                        payload = loads(body)
                    except orjson.JSONDecodeError:
                        payload = None
                    if isinstance(payload, dict):
                        records.append(DecodedRecord(offset, body_end, payload))
                        offset = body_end
                        continue
        decoded = decode_at(buf, offset, end)
        if isinstance(decoded, str):
            return ScanResult(records, offset, decoded, _next_valid_record(buf, offset + 1, end))
        records.append(decoded)  # not reached: decode_at agrees with the checks above
        offset = decoded.end
    return ScanResult(records, offset)


def is_end_mark(buf: bytes, offset: int, stop: int) -> bool:
    """True if the header-sized span at ``offset`` (cut at ``stop``) is all zeros."""
    span = buf[offset : min(offset + HEADER.size, stop)]
    return span.count(0) == len(span)


def _next_valid_record(buf: bytes, offset: int, stop: int) -> int | None:
    """Offset of the first fully valid record at or after ``offset``, if any."""
    while True:
        candidate = buf.find(MAGIC, offset, stop)
        if candidate < 0:
            return None
        if isinstance(decode_at(buf, candidate, stop), DecodedRecord):
            return candidate
        offset = candidate + 1
