"""Fixtures shared by the integration tests: migrated databases, in-process apps, real servers.

The helpers behind them live in ``tests/harness``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core import migrate
from app.main import create_app
from tests.harness import (
    RLGUARD,
    Api,
    AppClient,
    RedisServer,
    ServerProcess,
    free_port,
    make_settings,
)
from tests.harness.alerting import webhook_alerts_file
from tests.harness.stack import Stack, fast_policy
from tests.unit.app.alerts._recording_server import RecordingServer


@pytest.fixture
def migrated_url(database_url: str) -> str:
    """A database (SQLite and PostgreSQL, by parametrization) at the latest revision."""
    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def migrated_pg(postgres_url: str) -> str:
    """A PostgreSQL database at the latest revision."""
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Apps on a given database URL, shut down at teardown."""
    clients: list[AppClient] = []

    def factory(url: str, **overrides: object) -> Api:
        # The foundation alone: later features' lifespans (the policy tick) are left out here;
        # the real `rlguard server` subprocesses in these tests run with them.
        settings = make_settings(url, tmp_path / f"data{len(clients)}", **overrides)
        app = create_app(settings, extra_lifespans=[])
        client = AppClient(app)
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()


@pytest.fixture
def api(migrated_url: str, make_api: Callable[..., Api]) -> Api:
    return make_api(migrated_url)


@pytest.fixture
def hardened_api(migrated_pg: str, make_api: Callable[..., Api]) -> Callable[..., Api]:
    """Apps on one migrated PostgreSQL database, with settings overridden per call."""
    return lambda **overrides: make_api(migrated_pg, **overrides)


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Real ``rlguard COMMAND`` server processes on free ports, killed at teardown."""
    servers: list[ServerProcess] = []

    def factory(command: str, env: dict[str, str], port: int | None = None) -> ServerProcess:
        port = port or free_port()
        argv = [*RLGUARD, command, "--host", "127.0.0.1", "--port", str(port)]
        s = ServerProcess(argv, env, port, tmp_path / f"server-{len(servers)}.log")
        servers.append(s)
        return s

    yield factory
    for s in servers:
        s.kill9()


@pytest.fixture
def embedded_stack(tmp_path: Path) -> Iterator[Stack]:
    """Server with the policy scheduler on, embedded SQLite database and broker."""
    stack = Stack(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'rlguard.db'}",
        redis=None,
        policy=fast_policy(tmp_path / "policy.yaml"),
    )
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, on a free port, so stopping it never touches the machine's."""
    r = RedisServer(tmp_path)
    r.start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    """The local HTTP receiver the alerts are delivered to (Slack, WeCom and webhook paths)."""
    srv = RecordingServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def webhook_stack(
    tmp_path: Path, postgres_url: str, own_redis: RedisServer, server: RecordingServer
) -> Iterator[Callable[..., Stack]]:
    """A stack factory (PostgreSQL, a Redis of the test's own, one webhook channel to the
    ``server`` receiver): call it with ``fast_policy``'s dotted policy overrides."""
    made: list[Stack] = []

    def make(**overrides: Any) -> Stack:
        # No quiet period resolves anything while the test looks (a resolution is an alert too).
        policy = fast_policy(
            tmp_path / "policy.yaml", **{"incidents.quiet_period_seconds": 120, **overrides}
        )
        s = Stack(tmp_path, database_url=postgres_url, redis=own_redis, policy=policy)
        s.env["RLGUARD_ALERTS_FILE"] = str(webhook_alerts_file(tmp_path / "alerts.yaml", server))
        made.append(s)
        return s

    try:
        yield make
    finally:
        for s in made:
            s.close()
