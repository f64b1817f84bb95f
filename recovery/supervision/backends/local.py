"""The ``local`` backend: the launcher's processes are its own children on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path


class LocalBackend:
    """Processes run as children of the launcher; a whole-job restart is the launcher's job."""

    name = "local"

    def check(self) -> None:
        return None

    def spawn(
        self, argv: list[str], *, env: Mapping[str, str], log_path: Path, cwd: Path | None
    ) -> subprocess.Popen[bytes]:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # Same process group as the launcher: whoever stops the launcher's group (a test, a
            # scheduler) stops its processes too, even after a kill -9 of the launcher.
            return subprocess.Popen(
                argv, env=dict(env), cwd=cwd, stdout=log, stderr=log, stdin=subprocess.DEVNULL
            )

    def kill(self, proc: subprocess.Popen[bytes], timeout: float) -> None:
        if proc.poll() is not None:
            return
        try:
            os.kill(proc.pid, signal.SIGKILL)  # also ends a SIGSTOPped (hung) process
        except ProcessLookupError:
            pass
        proc.wait(timeout=timeout)

    def requeue_job(self, reason: str) -> bool:
        return False

    def node_state(self) -> str | None:
        return None


BACKEND = LocalBackend()
