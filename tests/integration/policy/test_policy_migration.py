"""The policy tables come from Alembic revision 0002 and match the models, on both databases."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import app.models.action
import app.models.approval
import app.models.incident  # noqa: F401 - registers the tables
from app.core import migrate
from app.core.db import make_engine
from app.models._base import metadata

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

POLICY_TABLES = {
    "incident",
    "incident_event",
    "fault_signal",
    "recovery_action",
    "approval",
    "scheduler_lease",
}


def _table_of(diff: object) -> str | None:
    """The table an autogenerate diff is about (diffs are tuples, or lists of tuples)."""
    item = diff[0] if isinstance(diff, list) else diff
    assert isinstance(item, tuple)
    for part in item[1:]:
        if isinstance(part, sa.Table):
            return part.name
        table = getattr(part, "table", None)
        if isinstance(table, sa.Table):
            return table.name
    return item[2] if len(item) > 2 and isinstance(item[2], str) else None


def test_upgrade_matches_models_and_round_trips(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            assert POLICY_TABLES <= set(sa.inspect(conn).get_table_names())
            diffs = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), metadata
            )
        mine = [d for d in diffs if _table_of(d) in POLICY_TABLES]
        assert mine == []
        migrate.downgrade(database_url, "0001_foundation")
        with engine.connect() as conn:
            assert not POLICY_TABLES & set(sa.inspect(conn).get_table_names())
        migrate.upgrade(database_url)
        assert migrate.is_up_to_date(database_url)
    finally:
        engine.dispose()
