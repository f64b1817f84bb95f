"""The tail of a supervised process's own output: what it printed last before it ended.

The launcher is not in the output's path: a child writes its stdout and stderr straight into
its log file (``<run_dir>/logs/<role>-<rank>.log``, appended across restarts), as it did before
this module, so a child printing as fast as it can is never slowed by the launcher, and a
launcher that is busy, or killed, cannot block it or break its pipe. :class:`OutputTail`
remembers where the current start's output begins in that file (:meth:`mark`, at the spawn)
and, when the process ends, reads at most ``max_bytes`` back from the end of what that start
wrote: a bounded ring over the file, whatever the process printed (100 MB or 100 GB), never
the whole log and never an earlier start's output. The lines are redacted
(:mod:`recovery.redaction`) before anything else sees them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from recovery.redaction import redact_text

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_LINES = 200
MAX_LINE_CHARS = 1024
# Terminal colour codes (tqdm, rich, vLLM's coloured logger) would split a pattern's words.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class OutputTail:
    """The bounded tail of one process slot's log file (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_lines: int = DEFAULT_MAX_LINES,
    ) -> None:
        if max_bytes <= 0 or max_lines <= 0:
            raise ValueError(
                f"max_bytes and max_lines must be positive, got {max_bytes}, {max_lines}"
            )
        self.path = path
        self.max_bytes = max_bytes
        self.max_lines = max_lines
        self._start = 0

    def mark(self) -> None:
        """The current start's output begins here (call when the process is spawned)."""
        try:
            self._start = os.stat(self.path).st_size
        except FileNotFoundError:
            self._start = 0

    def lines(self, secrets: Mapping[str, str] = {}) -> list[str]:
        """The last lines this start wrote (oldest first), at most ``max_lines`` lines from at
        most ``max_bytes`` bytes, without colour codes, each cut at ``MAX_LINE_CHARS``, with
        ``secrets`` (value -> mask) and URL credentials redacted."""
        try:
            with open(self.path, "rb") as f:
                end = f.seek(0, os.SEEK_END)
                begin = max(self._start, end - self.max_bytes)
                f.seek(begin)
                raw = f.read(end - begin)
        except FileNotFoundError:
            return []
        if begin > self._start and b"\n" in raw:
            raw = raw.split(b"\n", 1)[1]  # the first line was cut by the window: drop it
        text = raw.decode("utf-8", errors="replace").replace("\r", "\n")
        out = []
        for line in text.split("\n")[-self.max_lines - 1 :]:
            line = _ANSI.sub("", line).rstrip()
            if line:
                out.append(redact_text(line[:MAX_LINE_CHARS], secrets))
        return out[-self.max_lines :]
