"""``table_of``: the typed way to a table model's Core table (for conditional updates)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

from app.core.db import table_of
from app.models import MetricRollup
from app.models.action import RecoveryAction


@pytest.mark.parametrize("model", [RecoveryAction, MetricRollup])
def test_it_is_the_model_s_own_table(model: type[SQLModel]) -> None:
    table = table_of(model)
    assert isinstance(table, sa.Table)
    assert table is model.__table__  # type: ignore[attr-defined]
    assert table.name == model.__tablename__


def test_a_model_without_a_table_is_refused() -> None:
    class NotATable(SQLModel):
        name: str

    with pytest.raises(AttributeError, match="__table__"):
        table_of(NotATable)
