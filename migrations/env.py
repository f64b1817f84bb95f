"""Alembic environment. The URL comes from the config's ``sqlalchemy.url`` when the caller set it
(``app.core.migrate`` always does), else from RLGuard's settings (``RLGUARD_DATABASE_URL``)."""

from __future__ import annotations

import importlib

from alembic import context
from sqlalchemy.engine import Connection

from app.core.db import is_sqlite, make_engine

# Modules whose tables belong to the schema (used by autogenerate; upgrades are explicit).
# Later features add their model modules here.
MODEL_MODULES = [
    "app.models",
    "app.models.incident",
    "app.models.action",
    "app.models.approval",
    "app.models.alert",
    "app.models.phase",
    "app.models.progress",
    "app.models.guardrails",
    "app.models.silence",
    "app.models.drill",
]
for _module in MODEL_MODULES:
    importlib.import_module(_module)

from app.models._base import metadata as target_metadata  # noqa: E402

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from app.core.config import get_settings

    return get_settings().db_url


def _configure(connection: Connection | None, url: str) -> None:
    context.configure(
        connection=connection,
        url=None if connection is not None else url,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=is_sqlite(url),
        compare_type=True,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    url = _url()
    _configure(None, url)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection, _url())
        with context.begin_transaction():
            context.run_migrations()
        return
    url = _url()
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn, url)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
