"""The lifeline of the process groups a pytest run started: run as ``python -m
tests.harness._guardian`` with a pipe from pytest on stdin.

pytest writes ``+PGID`` for every group it starts and ``-PGID`` for one it has reaped itself.
When the pipe closes (pytest ended, normally or by ``kill -9``), every group still listed is
killed with SIGKILL, so no server, agent or worker outlives the run that started it.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    groups: set[int] = set()
    for line in sys.stdin:
        line = line.strip()
        if line.startswith("+"):
            groups.add(int(line[1:]))
        elif line.startswith("-"):
            groups.discard(int(line[1:]))
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone


if __name__ == "__main__":
    main()
