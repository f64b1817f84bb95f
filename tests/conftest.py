"""Fixtures shared by every test layer.

Real services only: PostgreSQL and Redis must be reachable (CI starts or checks them); a missing
service fails the test loudly instead of skipping it. Each PostgreSQL test gets a database of its
own, so test runs (and developers) never see each other's rows.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

POSTGRES_ADMIN_URL = os.environ.get(
    "RLGUARD_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("RLGUARD_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def unused_port() -> int:
    return free_port()


def _require_tcp(host: str, port: int, what: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=2):
            return
    except OSError as exc:
        pytest.fail(f"{what} is required at {host}:{port} but is not reachable: {exc}")


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    import sqlalchemy as sa

    _require_tcp("127.0.0.1", 5432, "PostgreSQL")
    name = f"rlg_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base, _, _ = POSTGRES_ADMIN_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'rlguard.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Runs the test once on the embedded SQLite default and once on real PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'rlguard.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


@pytest.fixture
def redis_url() -> str:
    """The machine's Redis. Tests that stop Redis must start their own on a free port instead."""
    _require_tcp("127.0.0.1", 6379, "Redis")
    return REDIS_URL
