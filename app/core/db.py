"""Database engine and sessions.

SQLite (the embedded default) gets WAL journaling, a busy timeout so concurrent writers (server,
CLI, worker) wait instead of failing, foreign keys, and the configured ``synchronous`` level.
The schema is never created here: ``alembic upgrade head`` (``app.core.migrate``) owns it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.orm import SessionTransaction
from sqlmodel import Session, SQLModel

SQLITE_BUSY_TIMEOUT_MS = 10_000


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (None for another database or an in-memory one)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def table_of(model: type[SQLModel]) -> sa.Table:
    """The Core table of a table model, typed (SQLModel declares ``__table__`` on the class it
    builds, where type checkers cannot see it): for the conditional updates (``UPDATE ... WHERE
    status = ...``, whose row count decides) and the bulk upserts written in Core."""
    return cast(sa.Table, model.__table__)  # type: ignore[attr-defined]


def dialect_insert(dialect: str, table: sa.Table) -> Any:
    """An INSERT for ``table`` that has ``on_conflict_do_nothing`` / ``on_conflict_do_update``.

    Those clauses exist only on the dialect-specific inserts; RLGuard runs on SQLite and
    PostgreSQL and refuses anything else loudly rather than writing duplicates.
    """
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(
        f"unsupported database dialect {dialect!r}: RLGuard needs SQLite or PostgreSQL"
    )


def make_engine(
    url: str,
    *,
    sqlite_synchronous: str = "FULL",
    sqlite_busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    **kwargs: Any,
) -> Engine:
    """An engine for ``url``; creates the SQLite file's directory when needed.

    ``sqlite_busy_timeout_ms=0`` makes a write that finds the database locked fail at once
    instead of waiting (the inline ingest commit relies on that never to block the event loop).
    """
    if is_sqlite(url):
        db_path = make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_ms / 1000},
            **kwargs,
        )
        sync_mode = sqlite_synchronous.upper()

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(sqlite_busy_timeout_ms)}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA synchronous={sync_mode}")
            cur.close()

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return sa.create_engine(url, **kwargs)


def begin_write(target: Session | Connection) -> None:
    """Make the current transaction the database's writer before it reads what it will change.

    Every guarded state transition (an approval decided, the last admin kept, a silence or a
    breaker ended, an action claimed, a release planned) reads a state, checks it and writes the
    next one; two requests doing that at once must not both pass the check. On PostgreSQL the
    caller's row locks (``SELECT ... FOR UPDATE``) and conditional UPDATEs serialize them, and
    this does nothing. SQLite ignores ``FOR UPDATE``, and pysqlite sends ``BEGIN`` only before
    the first write, so both requests read the old state outside any transaction and both write
    their decision (a probe saw an approval both approved and rejected, 16 rounds in 20).
    ``BEGIN IMMEDIATE`` takes SQLite's one write lock first (waiting up to the busy timeout), so
    the check sees every transition committed before it and the next one waits until this
    transaction ends. Call it first thing in the transaction: a transaction that has already
    written holds the lock, and is left as it is.
    """
    conn = target.connection() if isinstance(target, Session) else target
    if conn.dialect.name != "sqlite":
        return
    if conn.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
        return
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def begin_savepoint(session: Session) -> SessionTransaction:
    """``session.begin_nested()``, a real savepoint inside the caller's transaction on SQLite too.

    pysqlite (legacy transaction control) sends BEGIN only before an INSERT, UPDATE or DELETE.
    A SAVEPOINT that comes first in a transaction therefore runs in autocommit mode: it starts
    a transaction of its own, and its RELEASE commits what it covered at once, ahead of and
    apart from the rest of the caller's transaction (seen: an incident row visible, and kept by
    a crash, without the timeline and actions written with it). Begin the real one first.
    """
    if session.get_bind().dialect.name == "sqlite":
        conn = session.connection()
        if not conn.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]
            conn.exec_driver_sql("BEGIN")
    return session.begin_nested()


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def ping(engine: Engine) -> None:
    """Raises if the database cannot answer a trivial query."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
