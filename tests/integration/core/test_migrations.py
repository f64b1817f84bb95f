"""Alembic migrations on SQLite and PostgreSQL: head, down to base, up again; models match."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import app.models  # noqa: F401  (registers the foundation tables)
from app.core import migrate
from app.core.db import make_engine
from app.models import metadata

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FOUNDATION_TABLES = {
    "node",
    "job",
    "participant",
    "metric_rollup",
    "user_account",
    "api_token",
    "audit_event",
    "ingest_cursor",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_round_trip(database_url: str) -> None:
    migrate.upgrade(database_url)
    assert FOUNDATION_TABLES <= _tables(database_url)
    assert migrate.is_up_to_date(database_url)
    migrate.downgrade(database_url, "base")
    assert _tables(database_url) <= {"alembic_version"}
    assert migrate.current_revision(database_url) is None
    migrate.upgrade(database_url)
    assert FOUNDATION_TABLES <= _tables(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision(database_url)


def test_foundation_models_match_the_migrated_schema(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diffs = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()

    def table_of(diff: object) -> str | None:
        item = diff[0] if isinstance(diff, list) else diff
        for part in item[1:]:  # type: ignore[index]
            name = getattr(part, "name", None) if not isinstance(part, str) else None
            table = getattr(part, "table", None)
            if table is not None and getattr(table, "name", None):
                return table.name
            if isinstance(part, sa.Table):
                return part.name
            if name in FOUNDATION_TABLES:
                return name
        for part in item[1:]:  # type: ignore[index]
            if isinstance(part, str) and part in FOUNDATION_TABLES:
                return part
        return None

    ours = [d for d in diffs if table_of(d) in FOUNDATION_TABLES]
    assert ours == []


def test_migrating_from_any_working_directory(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    migrate.upgrade(url)
    assert "node" in _tables(url)
