"""The kernel's OOM-kill record for a process the launcher saw die of SIGKILL.

A process the kernel's OOM killer ends prints nothing: SIGKILL gives it no chance. Its own
output cannot say why; the kernel's record can. cgroup v2 counts the OOM kills of a cgroup in
``memory.events`` (``oom_kill N``); the launcher's children share its cgroup, so the launcher
reads the counter when it starts a process and when that process ends. A count that rose
while the process ran, with the process ended by SIGKILL, is the kernel's record of an
OOM kill in that cgroup, and becomes one line (:func:`oom_kill_line`) that the exit-cause
catalogue matches like the process's own output (row ``host_oom_killed``). A SIGKILL with no
such record (a person's ``kill -9``, a scheduler's preemption) stays a cause unknown.
"""

from __future__ import annotations

from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_events_path(proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> Path | None:
    """``memory.events`` of this process's cgroup (v2), or None where there is none."""
    try:
        for line in proc_self_cgroup.read_text().splitlines():
            hierarchy, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            if hierarchy == "0" and controllers == "":
                candidate = _CGROUP_ROOT / path.lstrip("/") / "memory.events"
                return candidate if candidate.is_file() else None
    except OSError:
        return None
    return None


def oom_kills(events: Path | None) -> int | None:
    """The ``oom_kill`` count of ``events``, None when it cannot be read."""
    if events is None:
        return None
    try:
        for line in events.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill" and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def oom_kill_line(before: int | None, after: int | None, events: Path | None) -> str | None:
    """The line that records an OOM kill between two readings, or None if there was none."""
    if before is None or after is None or after <= before:
        return None
    return (
        f"oom-kill: the kernel's OOM killer ended a process of this cgroup while it ran "
        f"({events} oom_kill {before} -> {after})"
    )
