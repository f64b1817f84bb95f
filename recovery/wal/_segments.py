"""Segment files of the write-ahead log: naming, creation, repair on open, compaction swap."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from recovery.fsio import fsync_directory
from recovery.wal._errors import WALCorruptionError
from recovery.wal._format import HEADER, MAX_PAYLOAD_BYTES, DecodedRecord, decode_at, scan

logger = logging.getLogger("rlguard.recovery.wal")

_SEGMENT_NAME = re.compile(r"^wal-(\d{16})\.log$")


def read_range(path: Path, offset: int, stop: int | None) -> bytes:
    """Bytes ``offset`` up to ``stop`` (or end of file) of ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        end = os.fstat(fd).st_size if stop is None else stop
        chunks: list[bytes] = []
        position = offset
        while position < end:
            chunk = os.pread(fd, end - position, position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class RepairResult:
    """Where writing continues after open, and whether files had to be changed to get there.

    ``zeroed_end``: the last segment holds only zeros from ``valid_end`` up to here (space
    preallocated by an earlier writer that the next records can use as it is).
    """

    last_segment: int
    valid_end: int
    changed: bool
    zeroed_end: int


class SegmentDirectory:
    """The ``wal-<n>.log`` files of one log directory."""

    def __init__(self, directory: Path, *, sync: bool) -> None:
        self.directory = directory
        self._sync = sync

    def path(self, seg: int) -> Path:
        """File name of segment ``seg``."""
        return self.directory / f"wal-{seg:016d}.log"

    def list(self) -> list[int]:
        """Numbers of the existing segments, ascending."""
        numbers = []
        for name in os.listdir(self.directory):
            match = _SEGMENT_NAME.fullmatch(name)
            if match:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def create(self, seg: int) -> None:
        """Create an empty segment (emptying a leftover that was never written to)."""
        fd = os.open(self.path(seg), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.close(fd)
        if self._sync:
            fsync_directory(self.directory)

    def fsync_segment(self, seg: int) -> None:
        """fsync one segment file."""
        fd = os.open(self.path(seg), os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def install_compacted(self, seg: int, content: bytes) -> int:
        """Write ``content`` as segment ``seg`` atomically (temp file, fsync, rename)."""
        final = self.path(seg)
        temp = final.with_name(final.name + ".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            if self._sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
        if self._sync:
            fsync_directory(self.directory)
        return len(content)

    def remove_below(self, seg: int) -> int:
        """Delete every segment numbered below ``seg``; return how many were deleted."""
        removed = 0
        for number in self.list():
            if number < seg:
                self.path(number).unlink(missing_ok=True)
                removed += 1
        if removed and self._sync:
            fsync_directory(self.directory)
        return removed

    def repair(self) -> RepairResult:
        """Bring the files into a consistent shape on open (caller holds both locks).

        Removes half-written compaction output and segments superseded by a finished
        compaction, and truncates a torn or corrupt tail of the last segment. A bad record
        that is followed by a valid one raises :class:`WALCorruptionError`.
        """
        changed = False
        for name in os.listdir(self.directory):
            if name.startswith("wal-") and name.endswith(".log.tmp"):
                (self.directory / name).unlink()
                changed = True
        segments = self.list()
        if not segments:
            self.create(1)
            return RepairResult(1, 0, changed, 0)
        for seg in reversed(segments):
            if self._starts_with_base(seg) and seg != segments[0]:
                removed = self.remove_below(seg)
                logger.warning(
                    "WAL %s: removed %d segments superseded by compacted segment %d",
                    self.directory,
                    removed,
                    seg,
                )
                changed = True
                break
        last = self.list()[-1]
        path = self.path(last)
        content = read_range(path, 0, None)
        result = scan(content)
        if result.problem is None:
            if content.count(0, result.valid_end) == len(content) - result.valid_end:
                return RepairResult(last, result.valid_end, changed, len(content))
            # Past the end mark lie bytes of a writer killed before its record counted (its
            # record was overwritten by a shorter one) or written out of order before a power
            # loss. None of them was acknowledged; drop them so the space reads as zeros.
            reason = "bytes after the end mark"
        elif result.resumes_at is not None:
            raise WALCorruptionError(
                path,
                result.valid_end,
                f"{result.problem}; a valid record follows at byte {result.resumes_at}",
            )
        else:
            reason = result.problem
        logger.warning(
            "WAL %s: truncating %d bytes of torn or corrupt tail at byte %d of %s (%s)",
            self.directory,
            len(content) - result.valid_end,
            result.valid_end,
            path.name,
            reason,
        )
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.ftruncate(fd, result.valid_end)
            if self._sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return RepairResult(last, result.valid_end, True, result.valid_end)

    def _starts_with_base(self, seg: int) -> bool:
        head = read_range(self.path(seg), 0, HEADER.size + MAX_PAYLOAD_BYTES)
        first = decode_at(head, 0, len(head))
        return isinstance(first, DecodedRecord) and first.payload.get("k") == "base"
