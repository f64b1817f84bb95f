"""The lifeline of the processes a pytest run started: run as ``python _guardian.py TOKEN``
with a pipe from pytest on stdin (it imports nothing of the tests or the product).

pytest writes ``+PGID`` for every process group it starts and ``-PGID`` for one it has reaped
itself. When the pipe closes (pytest ended, normally or by ``kill -9``), every group still listed
is killed with SIGKILL, and so is every process whose environment carries the run's TOKEN (what
product code started for a test, in sessions of its own), so nothing outlives the run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

TOKEN_VAR = "PYTEST_RLGUARD_RUN"


def processes_of_run(token: str) -> list[int]:
    """Pids of live processes whose environment carries ``token`` (this process excluded)."""
    needle = f"{TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_all(
    groups: set[int], token: str, *, spare: frozenset[int] | set[int] = frozenset()
) -> None:
    """SIGKILL every group in ``groups`` and every process of the run but those in ``spare``."""
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
    for pid in processes_of_run(token):
        if pid not in spare:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main() -> None:
    token = sys.argv[1]
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("+"):
            groups.add(int(line[1:]))
        elif line.startswith("-"):
            groups.discard(int(line[1:]))
    kill_all(groups, token)


if __name__ == "__main__":
    main()
