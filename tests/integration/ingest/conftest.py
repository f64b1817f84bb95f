"""Fixtures for ingest's integration tests: in-process apps on SQLite and PostgreSQL (the
foundation's ``Api``), on a migrated database per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.core import migrate
from app.main import create_app
from tests.harness import Api, AppClient, make_settings


@pytest.fixture
def make_ingest_api(database_url: str, tmp_path: Path) -> Iterator[Callable[..., Api]]:
    """Apps on ``database_url`` (both backends by parametrization), lifespan entered."""
    migrate.upgrade(database_url)
    clients: list[AppClient] = []

    def factory(**overrides: object) -> Api:
        settings = make_settings(database_url, tmp_path / f"data{len(clients)}", **overrides)
        client = AppClient(create_app(settings, extra_lifespans=[]))
        clients.append(client)
        return Api(client)

    yield factory
    for c in reversed(clients):
        c.close()
