from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

import app.models  # noqa: F401  (registers the tables the alert rows refer to)
import app.models.alert  # noqa: F401
from app.core.db import make_engine
from app.core.migrate import upgrade
from tests.integration.alerts._webhook_stack import own_redis, webhook_stack  # noqa: F401
from tests.unit.app.alerts._recording_server import RecordingServer


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated database (SQLite and PostgreSQL, via the shared `database_url` fixture)."""
    upgrade(database_url)
    eng = make_engine(database_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    srv = RecordingServer()
    try:
        yield srv
    finally:
        srv.stop()
