"""The broker that needs no server: kombu's SQLAlchemy transport on a SQLite file, safe for
several processes.

Without Redis, the server (its outbox dispatcher publishes), the embedded worker of
``rlguard up`` and any ``rlguard worker`` share one SQLite file. kombu's transport guards the
creation of a queue row and of its tables with a *thread* lock only, so two processes that
declare the same queue at the same moment (the dispatcher publishing to ``node.n1`` while a
worker for ``node.n1`` starts) both find no row, both insert, and the second dies with
``IntegrityError: UNIQUE constraint failed: kombu_queue.name``; two processes creating the
tables race the same way ("table kombu_queue already exists"). This transport lets the loser
of either race use what the winner wrote.

It also creates the broker file's directory (owner-only) when it first connects, so that
building the Celery app has no effect on the file system.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kombu.transport import sqlalchemy as kombu_sqlalchemy
from sqlalchemy.exc import IntegrityError, OperationalError

from app.core.db import sqlite_file

TRANSPORT = "app.tasks.sqlite_broker:Transport"
# kombu polls an empty queue this often (its default, 1 s, delays every action by up to 1 s).
POLLING_INTERVAL_SECONDS = 0.2


def broker_file_url(path: Path) -> str:
    """The broker URL of a SQLite file; use it with ``transport=TRANSPORT``."""
    return f"sqlite:///{path}"


class Channel(kombu_sqlalchemy.Channel):
    def _open(self) -> Any:
        path = sqlite_file(self.connection.client.hostname)
        if path is not None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            return super()._open()  # type: ignore[no-untyped-call]  # kombu is untyped
        except OperationalError as exc:
            if "already exists" not in str(exc):
                raise
            # Another process created the tables between kombu's check and its CREATE TABLE;
            # they exist now, so the second try only checks.
            return super()._open()  # type: ignore[no-untyped-call]  # kombu is untyped

    def _get_or_create(self, queue: str) -> Any:
        query = self.session.query(self.queue_cls).filter(self.queue_cls.name == queue)
        found = query.first()
        if found is not None:
            return found
        self.session.add(self.queue_cls(queue))
        try:
            self.session.commit()
        except IntegrityError:
            # Another process declared this queue between our SELECT and INSERT: use its row.
            self.session.rollback()
        except OperationalError:
            # kombu's own version swallows this and hands back an unsaved row; raised, it is a
            # connection error that kombu retries (a publish fails and the outbox resends it).
            self.session.rollback()
            raise
        return query.one()


class Transport(kombu_sqlalchemy.Transport):
    Channel = Channel
    polling_interval = POLLING_INTERVAL_SECONDS
