"""PostgreSQL and Redis for tests: the machine's (required, never skipped) and Redis servers of
a test's own, on free ports, that a test may stop and restart."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.harness.reaper import kill_group, spawn
from tests.harness.waiting import wait_for

POSTGRES_ADMIN_URL = os.environ.get(
    "RLGUARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("RLGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_tcp(host: str, port: int, what: str) -> None:
    """Fail the test loudly when a required service is not reachable."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        pytest.fail(f"{what} is required at {host}:{port} but is not reachable: {exc}")


def create_database() -> str:
    """A fresh, empty PostgreSQL database of its own; returns its URL."""
    import sqlalchemy as sa

    require_tcp("127.0.0.1", 5432, "PostgreSQL")
    name = f"rlg_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def drop_database(url: str) -> None:
    import sqlalchemy as sa

    name = url.rpartition("/")[2]
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


class RedisServer:
    """A redis-server of our own on a free port (no persistence), stoppable and restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is required on PATH for these tests")
        self.proc = spawn(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
            except redis.RedisError:
                return False

        wait_for(answers, 10, f"own redis-server on port {self.port}", interval=0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc)
        self.proc = None
