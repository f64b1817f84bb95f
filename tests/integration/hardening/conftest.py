"""In-process apps (lifespan entered) on a migrated PostgreSQL database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core import migrate
from app.main import create_app
from tests.integration.foundation.conftest import Api, AppClient, make_settings


@pytest.fixture
def migrated_pg(postgres_url: str) -> str:
    migrate.upgrade(postgres_url)
    return postgres_url


@pytest.fixture
def hardened_api(migrated_pg: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    clients: list[AppClient] = []

    def factory(**overrides: object) -> Api:
        settings = make_settings(migrated_pg, tmp_path / f"data{len(clients)}", **overrides)
        client = AppClient(create_app(settings, extra_lifespans=[]))
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()
