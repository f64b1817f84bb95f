"""Revisions 0012_guardrails and 0013_silences match the models on both databases and go down
and up again."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import app.models.action
import app.models.guardrails
import app.models.silence  # noqa: F401 - registers the tables
from app.core import migrate
from app.core.db import make_engine
from app.models._base import metadata
from tests.integration.policy.test_policy_migration import _table_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# The guard-rails on automation (0012: breakers, per-job switches, actions' not_before) and the
# silences (0013: silences, maintenance windows).
TABLES = {"circuit_breaker", "job_automation", "silence", "maintenance_window"}


def _columns(conn: sa.Connection, table: str) -> set[str]:
    return {c["name"] for c in sa.inspect(conn).get_columns(table)}


def test_guardrail_and_silence_tables_match_the_models_and_round_trip(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            assert TABLES <= set(sa.inspect(conn).get_table_names())
            assert "not_before" in _columns(conn, "recovery_action")
            diffs = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), metadata
            )
        assert [d for d in diffs if _table_of(d) in TABLES | {"recovery_action"}] == []
        migrate.downgrade(database_url, "0011_step_progress")
        with engine.connect() as conn:
            assert not TABLES & set(sa.inspect(conn).get_table_names())
            assert "not_before" not in _columns(conn, "recovery_action")
        migrate.upgrade(database_url)
        assert migrate.current_revision(database_url) == migrate.head_revision(database_url)
    finally:
        engine.dispose()
