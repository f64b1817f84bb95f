"""Start, read from and always clean up the real processes of the coordinator tests."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness import spawn

REPO = Path(__file__).resolve().parents[3]


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(
        self, module: str, *args: str, timeout: float = 30.0
    ) -> tuple[subprocess.Popen[str], str]:
        """Start ``python -m module args``; returns the process and the URL it printed."""
        proc = spawn(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("url "), f"{module} {args} did not start: {line!r}"
        return proc, line.split()[1]

    def participant(
        self, name: str, role: str, urls: list[str], version: tuple[int, int], mode: str = "normal",
        ckpt_root: Path | None = None,
    ) -> tuple[subprocess.Popen[str], Path]:  # fmt: skip
        log = self.tmp / f"{name}.log"
        args = [name, role, ",".join(urls), str(version[0]), str(version[1]), mode, str(log)]
        if ckpt_root is not None:
            args.append(str(ckpt_root))
        proc, _ = self.spawn("tests.integration.checkpoint._participant_proc", *args)
        return proc, log

    def kill(self, proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
        os.kill(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot die of SIGTERM
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()


def rounds(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def steps(log: Path) -> int:
    path = log.with_suffix(".steps")
    return int(path.read_text()) if path.exists() else 0
