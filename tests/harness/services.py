"""PostgreSQL and Redis for tests: the machine's (required, never skipped), and instances of a
test's own on free ports that it may stop, crash and restart (never the machine's).

PostgreSQL refuses to run as root, so when the tests run as root a test's own cluster is created
and run as the ``postgres`` user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.harness.reaper import kill_group, spawn
from tests.harness.waiting import wait_for

POSTGRES_ADMIN_URL = os.environ.get(
    "RLGUARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _machine_redis_url() -> str:
    """The machine's Redis, one database per pytest-xdist worker (``gw0`` → 1, ``gw1`` → 2, …):
    tests running side by side in two workers must never read each other's keys or Celery
    queues. A run without xdist uses database 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    db = int(worker.removeprefix("gw")) + 1 if worker.startswith("gw") else 0
    if db > 15:
        raise RuntimeError(f"{worker}: Redis has 16 databases; run at most 15 xdist workers")
    return f"redis://127.0.0.1:6379/{db}"


REDIS_URL = os.environ.get("RLGUARD_TEST_REDIS_URL") or _machine_redis_url()


# Ports handed to servers a test starts later. Never from the kernel's ephemeral range: a port
# picked there (bind to 0, close) is free only for a moment, and any outgoing connection of any
# process (to PostgreSQL, Redis, the server itself) may take it as its source port before the
# server binds it (CI: "address already in use" on a port picked seconds earlier). Below the
# ephemeral range only a listener binds a port, and each xdist worker has a slice of its own, so
# two workers never hand out the same one. Ray gives its workers 10002-19999, hence from 20000.
_PORT_FLOOR = 20000


def _port_slice() -> range:
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if ephemeral_low - _PORT_FLOOR < 1000:
        raise RuntimeError(
            f"the tests need ports {_PORT_FLOOR}-{_PORT_FLOOR + 999} outside the ephemeral range; "
            f"net.ipv4.ip_local_port_range starts at {ephemeral_low}"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    size = (ephemeral_low - _PORT_FLOOR) // count
    start = _PORT_FLOOR + index * size
    return range(start, start + size)


_port_lock = threading.Lock()
_ports: range | None = None
_next_port = 0  # index into _ports of the next one to try


def free_port() -> int:
    """A TCP port on 127.0.0.1 for a server this test starts: from this worker's slice below
    the ephemeral range, in turn (a port comes round again only after the whole slice), and free
    now (a bind test skips one still held, by a server of an earlier test or another program)."""
    global _ports, _next_port
    with _port_lock:
        if _ports is None:
            _ports = _port_slice()
            # another process of this worker's (a test's own subprocess) starts elsewhere
            _next_port = os.getpid() % len(_ports)
        for _ in range(len(_ports)):
            port = _ports[_next_port]
            _next_port = (_next_port + 1) % len(_ports)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port left in this test worker's slice")


@contextmanager
def refusing_port() -> Iterator[int]:
    """A port on 127.0.0.1 that refuses connections while the block runs: bound here and never
    listened on, so no other process (another xdist worker's server) can take it meanwhile, as
    it could take a port ``free_port`` said was free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


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

    def start(self) -> RedisServer:
        """Start (or restart, on the same port, empty)."""
        import redis

        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is required on PATH for these tests")
        self.workdir.mkdir(parents=True, exist_ok=True)
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
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc)
        self.proc = None


def hold_write_lock(url: str, held: threading.Event, release: threading.Event) -> None:
    """Hold the database's write lock (SQLite: a write transaction; PostgreSQL: the ingest cursor
    table) until ``release`` is set; ``held`` is set once it is taken. Run it in a thread to make
    the server's next commit wait: the "bad moment" of the kill -9 tests."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            else:
                conn.begin()
                conn.execute(sa.text("LOCK TABLE ingest_cursor IN ACCESS EXCLUSIVE MODE"))
            held.set()
            release.wait(60)
            conn.rollback()
    finally:
        engine.dispose()


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
        subprocess.run(
            [*self._as_user, *argv],
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def init(self) -> PostgresInstance:
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        if self._as_user:
            shutil.chown(self.workdir, "postgres", "postgres")
        self._run(
            _pg_bin("initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        )
        self.start()
        self._run(
            _pg_bin("createdb"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "rlguard",
        )
        return self

    def start(self) -> None:
        self._run(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.workdir / "pg.log"),
            "-w",
            "-o",
            f"-p {self.port} -k {self.workdir} -c listen_addresses=127.0.0.1",
            "start",
        )

    def stop_immediate(self) -> None:
        """Like a crash: no checkpoint, clients cut off mid-transaction."""
        self._run(_pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        """Stop the cluster if it runs (a test may leave it stopped), keep its log, remove it."""
        if (self.datadir / "postmaster.pid").exists():
            subprocess.run(
                [
                    *self._as_user,
                    _pg_bin("pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                timeout=60,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        server_log = self.workdir / "pg.log"
        if server_log.exists():
            shutil.copyfile(server_log, self.logfile)
        shutil.rmtree(self.workdir, ignore_errors=True)
