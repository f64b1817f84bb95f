"""Migration 0016: the drill table matches its model on SQLite and PostgreSQL, and goes away on
downgrade to 0015 (and comes back)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import app.models.drill  # noqa: F401  (registers the table)
from app.core import migrate
from app.core.db import make_engine
from app.models import metadata

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _diffs_and_tables(url: str) -> tuple[list[object], set[str]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diffs = [d for d in compare_metadata(ctx, metadata) if "drill" in repr(d)]
        return diffs, set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_the_drill_table_matches_its_model_and_downgrades(database_url: str) -> None:
    migrate.upgrade(database_url)
    diffs, tables = _diffs_and_tables(database_url)
    assert "drill" in tables and diffs == []
    migrate.downgrade(database_url, "0015_token_job_scope")
    assert "drill" not in _diffs_and_tables(database_url)[1]
    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision(database_url)
