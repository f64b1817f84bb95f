"""``rlguard db upgrade|downgrade|current``: the database schema (Alembic migrations)."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.exc import OperationalError

from app.cli.common import fail, info, load_settings, safe_url

db_cli = typer.Typer(help="Database schema (Alembic migrations).", no_args_is_help=True)


@db_cli.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Option(help="Target revision.")] = "head",
) -> None:
    """Apply migrations up to REVISION (default: the latest)."""
    from app.core import migrate

    settings = load_settings()
    try:
        migrate.upgrade(settings.db_url, revision)
    except OperationalError as exc:
        fail(f"database {safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
    except Exception as exc:  # alembic raises CommandError / util errors for bad revisions
        from alembic.util import CommandError

        if isinstance(exc, CommandError):
            fail(f"revision {revision!r}: {exc}")
        raise
    info(f"database {safe_url(settings.db_url)} is at {migrate.current_revision(settings.db_url)}")


@db_cli.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Argument(help="Target revision, or 'base'.")],
) -> None:
    """Revert migrations down to REVISION."""
    from alembic.util import CommandError

    from app.core import migrate

    settings = load_settings()
    try:
        migrate.downgrade(settings.db_url, revision)
    except CommandError as exc:
        fail(f"revision {revision!r}: {exc}")
    info(f"database {safe_url(settings.db_url)} is at {migrate.current_revision(settings.db_url)}")


@db_cli.command("current")
def db_current() -> None:
    """Print the database's current revision."""
    from app.core import migrate

    settings = load_settings()
    try:
        typer.echo(migrate.current_revision(settings.db_url) or "(empty)")
    except OperationalError as exc:
        fail(f"database {safe_url(settings.db_url)}: {str(exc.orig).splitlines()[0]}", code=1)
