"""Who owns a memory snapshot segment: ``OWNER`` in its root names the owner's pid.

The owner (the launcher) outlives the trainers that write into the segment and persists their
snapshots; a trainer checks :func:`owner_alive` at each snapshot and falls back to persisting by
itself when the owner is gone. Imports no torch (the launcher uses it).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recovery.fsio import write_json_atomic

OWNER_FILE = "OWNER"


def write_owner(root: Path, pid: int) -> None:
    """Record ``pid`` as the owner of the segment ``root`` (atomically replaced)."""
    write_json_atomic(root / OWNER_FILE, {"pid": pid, "since": time.time()}, sync=False)


def owner_pid(root: Path) -> int | None:
    """The pid recorded by :func:`write_owner`, or None when there is none (or it is garbled)."""
    try:
        pid = json.loads((root / OWNER_FILE).read_text(encoding="utf-8")).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def owner_alive(root: Path) -> bool:
    """True while the process recorded as the owner of ``root`` exists."""
    pid = owner_pid(root)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    # A zombie (exited, not yet reaped by its parent) still answers signal 0.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
