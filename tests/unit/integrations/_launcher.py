"""Helpers to run ``rlguard launch`` on a plain Python script in tests (also used by the
end-to-end test through the real server, agent and worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recovery.report import heartbeat_path, read_heartbeat
from recovery.supervision.events import read_events
from tests.harness import spawn, wait_for

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
# A training script that uses nothing but the heartbeat API (see _script.py).
SCRIPT = HERE / "_script.py"
TEST_INTEGRATION = "tests.unit.integrations._resume_integration"


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    base.update(extra)
    return base


class Launch:
    """``python -m integrations.launch ARGS -- python _script.py SCRIPT_ARGS`` in its own group."""

    def __init__(
        self,
        run_dir: Path,
        *args: str,
        script_args: tuple[str, ...] = (),
        environ: dict[str, str] | None = None,
        script: Path = SCRIPT,
    ) -> None:
        self.run_dir = run_dir
        self.stderr_path = run_dir.parent / f"{run_dir.name}-launch.err"
        self._err = open(self.stderr_path, "wb")  # noqa: SIM115
        self.proc = spawn(
            [
                sys.executable,
                "-m",
                "integrations.launch",
                "--run-dir",
                str(run_dir),
                *args,
                "--",
                sys.executable,
                str(script),
                *script_args,
            ],
            cwd=ROOT,
            env=environ or env(),
            stdout=subprocess.DEVNULL,
            stderr=self._err,
            start_new_session=True,
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(self.run_dir / "events.jsonl") if kind in (None, e["kind"])]

    def beat(self, role: str = "trainer", rank: int = 0) -> dict[str, Any]:
        return read_heartbeat(heartbeat_path(self.run_dir, role, rank)) or {}

    def starts(self, rank: int = 0) -> list[dict[str, Any]]:
        """What each start of the script saw (argv, environment), oldest first."""
        path = self.run_dir / f"starts-{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def logs(self) -> str:
        out = [f"--- launcher stderr\n{self.stderr_path.read_text(errors='replace')[-2000:]}"]
        for f in sorted((self.run_dir / "logs").glob("*.log")):
            out.append(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}")
        out.append(f"--- events\n{json.dumps(self.events())[-3000:]}")
        return "\n".join(out)

    def wait(self, pred: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        def checked() -> Any:
            value = pred()
            if not value and self.proc.poll() is not None:
                raise AssertionError(
                    f"launcher exited {self.proc.returncode} waiting for {what}\n{self.logs()}"
                )
            return value

        return wait_for(checked, timeout, what, context=self.logs)

    def hook(
        self, action: str, *args: str, key: str, wait: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "integrations.launch",
                "hook",
                action,
                "--job",
                self.run_dir.name,
                "--run-root",
                str(self.run_dir.parent),
                "--idempotency-key",
                key,
                "--wait",
                str(wait),
                *args,
            ],
            cwd=ROOT,
            env=env(),
            capture_output=True,
            text=True,
            timeout=wait + 30,
            check=False,
        )

    def kill_child(self, rank: int = 0) -> int:
        pid = int(self.beat(rank=rank)["pid"])
        os.kill(pid, signal.SIGKILL)
        return pid

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        try:  # anything of the group that outlived its launcher (never expected)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._err.close()
