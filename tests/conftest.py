"""Fixtures shared by every test layer.

Real services only: PostgreSQL and Redis must be reachable (CI starts or checks them); a missing
service fails the test loudly instead of skipping it. Each PostgreSQL test gets a database of its
own, so test runs (and developers) never see each other's rows. The helpers behind these
fixtures live in ``tests/harness``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.reaper import reap_all, start_run
from tests.harness.services import REDIS_URL, create_database, drop_database, free_port, require_tcp
from tests.harness.work_units import FilesWithVllmAsOneUnit, check_vllm_files


def pytest_configure(config: pytest.Config) -> None:
    """Before any test starts a process: every descendant of this run carries its token, so a
    guardian can kill them all if this pytest dies (see tests/harness/reaper.py).

    Under pytest-xdist each worker is a run of its own; the controller runs no test and starts
    nothing, and must not start a run: its token would be in every worker's environment, and
    reaping it at the end would kill the workers while xdist shuts them down."""
    if _is_xdist_controller(config):
        return
    start_run()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the files that start vLLM engines as one unit (see
    tests/harness/work_units.py); any other ``--dist`` is xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    return FilesWithVllmAsOneUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How a pytest-xdist run shares the tests out (``scripts/test.sh``: ``--dist loadfile
    --no-loadscope-reorder``). A test file is the unit of work (the files that start vLLM
    engines are one unit together): its tests run in one worker, in file order, as in a plain
    run, so module-scoped fixtures (a server, a browser) start once and a test that builds on the
    one before still sees it. Units are handed out in collection order, and here the files with
    a test marked ``slow`` move to the front, so the run does not end with one worker busy on a
    minute-long file while the others idle. Every worker sorts the same way (xdist requires all
    of them to collect the same list in the same order); a plain run keeps the order of the
    files."""
    check_vllm_files(items)
    if not hasattr(config, "workerinput"):
        return
    slow = {_file_of(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _file_of(item) not in slow)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No server, agent or worker a test started outlives the run (see tests/harness/reaper.py)."""
    reap_all()


@pytest.fixture
def unused_port() -> int:
    return free_port()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


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
    require_tcp("127.0.0.1", 6379, "Redis")
    return REDIS_URL
