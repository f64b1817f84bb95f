"""The launcher's timeline: one JSON object per line in ``<run_dir>/events.jsonl``.

Benchmarks and tests read it to time a recovery (exit seen, request, restart, first step). Each
line is one ``write`` on an ``O_APPEND`` descriptor, so lines of concurrent processes stay whole;
a line torn by ``kill -9`` is skipped by :func:`read_events`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def append_event(path: Path, kind: str, **fields: Any) -> None:
    """Append ``{"ts", "kind", "pid", **fields}`` as one line to ``path``."""
    line = json.dumps({"ts": time.time(), "kind": kind, "pid": os.getpid(), **fields})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every whole line of ``path``, oldest first; empty when the file does not exist."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line torn by kill -9: the rest of the timeline still counts
    return out
