"""What every ``rlguard`` command shares: one-line errors, the settings, a database session.

A bad value ends with one line ``rlguard: error: ...`` and exit status 2; an unreachable or
unmigrated database with status 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer
from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlmodel import Session

from app.core.config import Settings, get_settings
from app.core.errors import ServiceError

T = TypeVar("T")


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"rlguard: error: {message}", err=True)
    raise typer.Exit(code)


def info(message: str) -> None:
    typer.echo(message, err=True)


def safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _setting_error(exc: ValidationError) -> str:
    """A bad RLGUARD_* value as one line naming the variable and the value."""
    err = exc.errors()[0]
    where = "RLGUARD_" + "__".join(str(p) for p in err["loc"]).upper()
    return f"{where}: {err['msg']} (got {err.get('input')!r})"


def load_settings() -> Settings:
    get_settings.cache_clear()
    try:
        return get_settings()
    except ValidationError as exc:
        fail(_setting_error(exc))


def run(cli: typer.Typer) -> None:
    """Run ``cli``; a bad RLGUARD_* value met anywhere ends in one line, not a traceback."""
    try:
        cli()
    except ValidationError as exc:
        typer.echo(f"rlguard: error: {_setting_error(exc)}", err=True)
        raise SystemExit(2) from None


def run_db(settings: Settings, action: Callable[[Session], T]) -> T:
    """Run ``action`` in a session on the configured database, with one-line errors."""
    from app.core.db import make_engine

    engine = make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)
    try:
        with Session(engine, expire_on_commit=False) as session:
            result = action(session)
            session.commit()
            return result
    except ServiceError as exc:
        fail(str(exc))
    except (OperationalError, ProgrammingError) as exc:
        text = str(exc.orig).splitlines()[0] if exc.orig is not None else str(exc)
        hint = ""
        if "no such table" in text or "does not exist" in text:
            hint = "; run `rlguard db upgrade` first"
        fail(f"database {safe_url(settings.db_url)}: {text}{hint}", code=1)
    finally:
        engine.dispose()
