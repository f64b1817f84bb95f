"""Fixtures for the deployment tests: an in-process app on a migrated PostgreSQL database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core import migrate
from app.main import create_app
from tests.harness import Api, AppClient, make_settings


@pytest.fixture
def pg_api(postgres_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Apps (lifespans entered) on one migrated PostgreSQL database; closed at teardown."""
    migrate.upgrade(postgres_url)
    clients: list[AppClient] = []

    def factory(**overrides: object) -> Api:
        settings = make_settings(postgres_url, tmp_path / f"data{len(clients)}", **overrides)
        client = AppClient(create_app(settings, extra_lifespans=overrides.pop("_hooks", None)))
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()
