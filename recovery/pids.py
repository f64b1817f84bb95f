"""Whether a process id names a live process: one answer for every liveness check of the
recovery library (and the agent and workload beside it) that has only a pid to go on."""

from __future__ import annotations

import os


def process_exists(pid: int) -> bool:
    """True when a process ``pid`` exists on this host, whoever owns it (signal 0 is sent:
    nothing is delivered, only the kernel's permission and existence checks run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True
