from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.engine import Engine

from app.alerts import service as alert_service
from app.core.db import make_engine
from app.core.migrate import upgrade
from tests.unit.app.alerts._factories import config


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A migrated database (SQLite and PostgreSQL, via the shared `database_url` fixture) with
    alert channels configured, so that every alert-worthy timeline entry queues deliveries."""
    upgrade(database_url)
    eng = make_engine(database_url)
    alert_service.configure(config=config())
    try:
        yield eng
    finally:
        alert_service.configure(config=None)
        eng.dispose()
