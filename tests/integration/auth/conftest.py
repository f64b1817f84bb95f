"""Apps (lifespan entered) on a migrated PostgreSQL database, and browsers for their pages.

Several apps made by one test share the database, as server replicas do: whatever a test proves
across two of them holds for replicas behind the reference proxy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core import migrate
from app.main import create_app
from tests.harness import Api, AppClient, make_settings

pytestmark = [pytest.mark.integration]


@pytest.fixture
def auth_db_url(postgres_url: str) -> str:
    """The database the replicas share (PostgreSQL, as deployed); a module may override it."""
    return postgres_url


@pytest.fixture
def make_replica(auth_db_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    migrate.upgrade(auth_db_url)
    clients: list[AppClient] = []

    def factory(**overrides: object) -> Api:
        settings = make_settings(auth_db_url, tmp_path / f"data{len(clients)}", **overrides)
        client = AppClient(create_app(settings, extra_lifespans=[]))
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()
