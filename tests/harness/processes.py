"""Real RLGuard processes for tests: the server (``rlguard server`` / ``up``), a node agent
(``python -m agents``) and a Celery worker (``rlguard worker``), all started through
``reaper.spawn`` so none outlives the pytest run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.harness.reaper import forget, kill_group, spawn
from tests.harness.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
RLGUARD = [str(Path(sys.executable).parent / "rlguard")]


def rlguard_env(url: str | None, data_dir: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without its RLGUARD_* settings, plus these."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["RLGUARD_DATA_DIR"] = str(data_dir)
    if url is not None:
        env["RLGUARD_DATABASE_URL"] = url
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str], stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``rlguard ARGS`` to completion, output captured."""
    return subprocess.run(
        [*RLGUARD, *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


class ServerProcess:
    """A real ``rlguard`` server subprocess (any command that serves HTTP); killed at teardown."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        port: int,
        log: Path,
        *,
        ready_path: str = "/readyz",
    ) -> None:
        self.argv, self.env, self.port, self.log_path = argv, env, port, log
        self.ready_path = ready_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, *, wait_ready: bool = True, timeout: float = 60.0) -> ServerProcess:
        self.proc = spawn(self.argv, env=self.env, cwd=REPO, log=self.log_path)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                return httpx.get(self.url + self.ready_path, timeout=1).status_code == 200
            except httpx.TransportError:
                return False  # not listening yet

        wait_for(ready, timeout, f"server {self.ready_path}", context=self.output)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        """kill -9 the server and everything in its process group."""
        if self.proc is not None:
            kill_group(self.proc)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL if it has not exited within ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc)


def start_worker(
    *args: str, env: dict[str, str], log: Path, loglevel: str = "WARNING"
) -> subprocess.Popen[bytes]:
    """``rlguard worker ARGS``: the production entry point of a Celery worker, in a group of its
    own (its pool children with it); stop it with ``reaper.kill_group``."""
    return spawn([*RLGUARD, "worker", *args, "--loglevel", loglevel], env=env, cwd=REPO, log=log)


class AgentProcess:
    """``python -m agents ARGS``: a real node agent."""

    def __init__(
        self,
        *args: str,
        log_path: Path,
        env: dict[str, str] | None = None,
        spool_dir: Path | None = None,
        python: list[str] | None = None,
    ) -> None:
        # ``python``: the interpreter command (default this one; a wrapper such as
        # tests.harness.stack.on_a_clock_behind runs the agent on a wrong clock).
        self.args = [*(python or [sys.executable]), "-m", "agents", *args]
        self.log_path = log_path
        self.env = env
        self.spool_dir = spool_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        self.proc = spawn(self.args, env=self.env, cwd=REPO, log=self.log_path)
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 5.0) -> float:
        """SIGTERM and wait for a clean exit; returns how long the exit took."""
        assert self.proc is not None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        took = time.monotonic() - start
        assert rc == 0, self.log_path.read_text()[-2000:]
        forget(self.proc)
        self.proc = None
        return took

    def kill(self) -> None:
        """kill -9 (a stopped agent is continued first, so the kill is not held up)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)
            kill_group(self.proc)
        self.proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the group, SIGKILL if it has not exited within ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def status(self) -> dict[str, Any]:
        assert self.spool_dir is not None
        return dict(json.loads((self.spool_dir / "status.json").read_text()))
