"""Following a log file that another process appends to (the job's state log for the agent,
verl's console log for the Ray integration): the complete lines it gained since the last look.

A file replaced (a new inode) or cut shorter than what was read is read again from its start; a
last line without its newline yet waits for it; a missing file is no lines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class AppendedLines:
    """The lines appended to ``path`` since the last :meth:`read`.

    ``max_read``: bytes read at the most per call, so a long backlog cannot stall the caller's
    round (the rest comes with the next calls). ``look_back``: where the file is first seen,
    start this many bytes before its end (the line cut there is dropped) instead of at its start,
    to learn the current state without reading a long history.
    """

    path: Path
    max_read: int
    look_back: int | None = None
    _inode: int | None = field(default=None, init=False)
    _offset: int = field(default=0, init=False)
    _partial: bytes = field(default=b"", init=False)

    def read(self) -> tuple[list[bytes], bool]:
        """The complete, non-blank lines appended since the last call, and whether this call
        was the first to see the file (its lines are the history before the caller started)."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return [], False
        with handle:
            st = os.fstat(handle.fileno())
            first_open = self._inode is None
            if self._inode != st.st_ino or st.st_size < self._offset:
                # New or rotated/truncated file: start over.
                self._inode = st.st_ino
                self._partial = b""
                self._offset = 0
                if first_open and self.look_back is not None:
                    self._offset = max(0, st.st_size - self.look_back)
            if st.st_size == self._offset:
                return [], first_open
            handle.seek(self._offset)
            chunk = handle.read(self.max_read)
        skip_first = first_open and self._offset > 0
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()  # incomplete last line (or b"") waits for its newline
        if skip_first and lines:
            lines.pop(0)  # started mid-line
        return [line for line in lines if line.strip()], first_open
