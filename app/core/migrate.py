"""Run Alembic programmatically, so the installed package migrates from any working directory."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations
from app.core.db import make_engine


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    # __path__, not __file__: an editable install may map the package as a namespace.
    cfg.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def current_revision(database_url: str) -> str | None:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def is_up_to_date(database_url: str) -> bool:
    return current_revision(database_url) == head_revision(database_url)
