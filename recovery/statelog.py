"""The job's append-only state log, ``state_log.jsonl``: one JSON line per phase transition.

Each line is ``{"ts": <unix seconds>, "state": <name>, "payload": {...}}``, written with one
``write`` on an ``O_APPEND`` descriptor under a file lock and fsynced before ``append``
returns. The time each append takes is kept in :attr:`StateLog.last_write_latency_ms` for the
heartbeat reporter (the golden metric ``state_log_write_latency_ms``: healthy < 50 ms, warning
> 200 ms). A process killed mid-line leaves a torn last line: readers ignore it and the next
writer cuts it off before appending, so it never ends up in the middle of the file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery._closing import ClosesOnExit
from recovery._process_lock import ProcessLock
from recovery.errors import RecoveryError, RecoveryTimeout
from recovery.fsio import fsync_directory

__all__ = [
    "StateLog",
    "StateLogCorruptError",
    "StateLogError",
    "StateLogLockTimeout",
    "StateLogWriteError",
    "StateRecord",
    "last_state_record",
    "read_state_log",
]

logger = logging.getLogger("rlguard.recovery.statelog")

_MAX_LINE_BYTES = 1 << 20
_TAIL_CHUNK = 64 * 1024


class StateLogError(RecoveryError):
    """A state-log operation was refused or failed."""


class StateLogCorruptError(StateLogError):
    """A complete line that is not the last one cannot be decoded."""


class StateLogWriteError(StateLogError):
    """The storage refused an append (write or fsync failed): the run directory may not be
    writable. Counted in :attr:`StateLog.write_errors`."""


class StateLogLockTimeout(StateLogError, RecoveryTimeout):
    """The state log's lock was not free within ``lock_timeout``."""


@dataclass(frozen=True)
class StateRecord:
    """One line of the state log."""

    ts: float
    state: str
    payload: dict[str, Any]


class StateLog(ClosesOnExit):
    """Appends transitions to ``path`` durably and measures how long each append takes."""

    def __init__(
        self, path: str | os.PathLike[str], *, sync: bool = True, lock_timeout: float = 10.0
    ) -> None:
        if not isinstance(lock_timeout, int | float) or not lock_timeout > 0:
            raise StateLogError(f"lock_timeout must be a positive number, got {lock_timeout!r}")
        self.path = Path(path)
        self._sync = bool(sync)
        self._timeout = float(lock_timeout)
        #: Milliseconds the last :meth:`append` took (lock wait, write and fsync); None before
        #: the first append. Read by the heartbeat reporter.
        self.last_write_latency_ms: float | None = None
        #: The largest append latency since this handle was opened, in milliseconds.
        self.max_write_latency_ms: float | None = None
        #: Number of lines this handle appended.
        self.appends = 0
        #: Number of appends the storage refused (:class:`StateLogWriteError`).
        self.write_errors = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            created = not self.path.exists()
            self._fd = os.open(
                self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
            )
        except OSError as exc:
            raise StateLogError(f"cannot open state log {self.path}: {exc}") from exc
        if created and self._sync:
            fsync_directory(self.path.parent)
        self._lock = ProcessLock(
            self.path.with_name(self.path.name + ".lock"), timeout_error=StateLogLockTimeout
        )
        self._closed = False

    def append(self, state: str, payload: Mapping[str, Any] | None = None) -> StateRecord:
        """Append one line and return once it is durable; updates the latency figures.

        Raises :class:`StateLogError` (writing nothing) for an empty or multi-line state or a
        payload that is not a JSON object, and :class:`StateLogWriteError` when the storage
        refuses the write or the fsync.
        """
        if self._closed:
            raise StateLogError(f"state log {self.path} is closed")
        record = StateRecord(
            ts=time.time(), state=_check_state(state), payload=_check_payload(payload)
        )
        line = _encode(record)
        started = time.perf_counter()
        self._lock.acquire(self._timeout)
        try:
            self._cut_torn_tail()
            written = os.write(self._fd, line)
            if written != len(line):
                # Never leave half a line behind for the next writer to append to.
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
                self.write_errors += 1
                raise StateLogWriteError(
                    f"short write to {self.path}: {written} of {len(line)} bytes"
                )
            if self._sync:
                os.fdatasync(self._fd)
        except OSError as exc:
            self.write_errors += 1
            raise StateLogWriteError(f"cannot append to state log {self.path}: {exc}") from exc
        finally:
            self._lock.release()
        latency_ms = (time.perf_counter() - started) * 1000.0
        self.last_write_latency_ms = latency_ms
        if self.max_write_latency_ms is None or latency_ms > self.max_write_latency_ms:
            self.max_write_latency_ms = latency_ms
        self.appends += 1
        return record

    def close(self) -> None:
        """Close the file; idempotent."""
        if not self._closed:
            self._closed = True
            os.close(self._fd)
            self._lock.close()

    def _cut_torn_tail(self) -> None:
        """Drop a partial last line left by a writer killed mid-append (lock held)."""
        size = os.fstat(self._fd).st_size
        if size == 0 or os.pread(self._fd, 1, size - 1) == b"\n":
            return
        keep = _end_of_last_complete_line(self._fd, size)
        logger.warning("state log %s: cutting %d bytes of a torn last line", self.path, size - keep)
        os.ftruncate(self._fd, keep)


def read_state_log(path: str | os.PathLike[str]) -> list[StateRecord]:
    """Every complete line of the log, in order; a torn last line is ignored.

    A missing file reads as empty. A damaged line anywhere before the last raises
    :class:`StateLogCorruptError` naming the line number.
    """
    try:
        content = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    lines = content.split(b"\n")
    # The element after the final newline is empty, or a torn line that was never finished.
    complete = lines[:-1]
    records = []
    for number, raw in enumerate(complete, start=1):
        record = _decode(raw)
        if record is None:
            raise StateLogCorruptError(f"state log {path}: line {number} is not a valid record")
        records.append(record)
    return records


def last_state_record(
    path: str | os.PathLike[str], *, match: Callable[[StateRecord], bool] | None = None
) -> StateRecord | None:
    """The last complete record (that satisfies ``match``), reading the file from its end.

    Only the tail is read, so this stays cheap on a long log. A torn last line is ignored; a
    damaged complete line that is reached raises :class:`StateLogCorruptError`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        end = os.fstat(fd).st_size
        # Skip a torn last line: start from the end of the last complete line.
        if end and os.pread(fd, 1, end - 1) != b"\n":
            end = _end_of_last_complete_line(fd, end)
        # buffer holds bytes [position, end) not yet examined: whole lines, each ending "\n".
        buffer = b""
        position = end
        while True:
            body = buffer[:-1]
            cut = body.rfind(b"\n")
            if cut < 0 and position > 0:
                if len(buffer) > _MAX_LINE_BYTES:
                    raise StateLogCorruptError(
                        f"state log {path}: line before byte {position + len(buffer)} "
                        f"is over {_MAX_LINE_BYTES} bytes"
                    )
                start = max(0, position - _TAIL_CHUNK)
                buffer = os.pread(fd, position - start, start) + buffer
                position = start
                continue
            if not buffer:
                return None
            raw, buffer = body[cut + 1 :], body[: cut + 1]
            record = _decode(raw)
            if record is None:
                raise StateLogCorruptError(
                    f"state log {path}: damaged line at byte {position + len(buffer)}"
                )
            if match is None or match(record):
                return record
    finally:
        os.close(fd)


def _end_of_last_complete_line(fd: int, size: int) -> int:
    position = size
    while position > 0:
        start = max(0, position - _TAIL_CHUNK)
        chunk = os.pread(fd, position - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        position = start
    return 0


def _check_state(state: object) -> str:
    if not isinstance(state, str) or not state.strip() or "\n" in state or "\r" in state:
        raise StateLogError(f"state must be a non-empty single-line string, got {state!r}")
    return state


def _check_payload(payload: object) -> dict[str, Any]:
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise StateLogError(f"payload must be a mapping, got {type(payload).__name__}")
    try:
        normalized: dict[str, Any] = json.loads(json.dumps(dict(payload), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StateLogError(f"payload is not JSON-serializable: {exc}") from exc
    return normalized


def _encode(record: StateRecord) -> bytes:
    line = json.dumps(
        {"ts": record.ts, "state": record.state, "payload": record.payload},
        separators=(",", ":"),
        allow_nan=False,
    ).encode()
    if len(line) >= _MAX_LINE_BYTES:
        raise StateLogError(f"state-log line of {len(line)} bytes exceeds {_MAX_LINE_BYTES}")
    return line + b"\n"


def _decode(raw: bytes) -> StateRecord | None:
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    ts, state, payload = obj.get("ts"), obj.get("state"), obj.get("payload")
    if (
        not isinstance(ts, int | float)
        or isinstance(ts, bool)
        or not math.isfinite(ts)
        or not isinstance(state, str)
        or not isinstance(payload, dict)
    ):
        return None
    return StateRecord(ts=float(ts), state=state, payload=payload)
