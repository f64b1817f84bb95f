"""PostgreSQL and Redis instances a test starts, stops and restarts itself (never the machine's).

PostgreSQL refuses to run as root, so when the tests run as root the cluster is created and run
as the ``postgres`` user (``runuser``); its data directory lives under the test's tmp dir.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.harness import free_port


def _wait_port(port: int, timeout: float, up: bool = True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                if up:
                    return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise AssertionError(f"port {port} not {'open' if up else 'closed'} after {timeout} s")


class RedisInstance:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisInstance:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        _wait_port(self.port, 10)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        _wait_port(self.port, 10, up=False)


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    assert found, f"PostgreSQL's {name} is not installed under /usr/lib/postgresql/*/bin"
    return found[-1]


class PostgresInstance:
    """A throwaway cluster with trust auth on a free port; database ``rlguard``."""

    def __init__(self, workdir: Path) -> None:
        # Not under pytest's tmp dir: pytest resets /tmp/pytest-of-<user> to mode 700 whenever
        # a session starts (other test runs on this machine), which locks the postgres user out.
        self.workdir = Path(tempfile.mkdtemp(prefix="rlguard-test-pg-"))
        self.port = free_port()
        self.datadir = self.workdir / "pgdata"
        self.logfile = workdir / "pg.log"  # the log stays with the test's other files
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/rlguard"
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *argv: str, timeout: float = 60) -> None:
        subprocess.run([*self._as_user, *argv], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def init(self) -> PostgresInstance:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            shutil.chown(self.workdir, "postgres", "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.datadir), "-U", "postgres",
                  "--auth=trust", "--no-sync")
        self.start()
        self._run(_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                  "rlguard")
        return self

    def start(self) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.datadir), "-l", str(self.workdir / "pg.log"), "-w",
                  "-o", f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1",
                  "start")

    def stop_immediate(self) -> None:
        """Like a crash: no checkpoint, clients cut off mid-transaction."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        """Stop the cluster if it runs (a test may leave it stopped), keep its log, remove it."""
        if (self.datadir / "postmaster.pid").exists():
            subprocess.run(
                [*self._as_user, _pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                 "-w", "stop"],
                timeout=60, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        server_log = self.workdir / "pg.log"
        if server_log.exists():
            shutil.copyfile(server_log, self.logfile)
        shutil.rmtree(self.workdir, ignore_errors=True)
