"""The broker that needs no server: kombu's SQLAlchemy transport on a SQLite file, safe for
several processes.

Without Redis, the server (its outbox dispatcher publishes), the embedded worker of
``rlguard up`` and any ``rlguard worker`` share one SQLite file. kombu's transport guards the
creation of a queue row and of its tables with a *thread* lock only, so two processes that
declare the same queue at the same moment (the dispatcher publishing to ``node.n1`` while a
worker for ``node.n1`` starts) both find no row, both insert, and the second dies with
``IntegrityError: UNIQUE constraint failed: kombu_queue.name``; two processes creating the
tables race the same way ("table kombu_queue already exists"). This transport lets the loser
of the queue race use what the winner wrote, and serialises table creation across processes
with a lock file beside the broker file (a retry is not enough: with eight processes the loser
of ``kombu_queue`` can lose again on ``kombu_message``).

It also creates the broker file's directory (owner-only) when it first connects, so that
building the Celery app has no effect on the file system.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def _creation_lock(broker: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``<broker>.lock`` for as long as the block runs (every process
    that opens this broker file takes the same one); released by the OS if the holder dies."""
    fd = os.open(broker.with_name(broker.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


class Channel(kombu_sqlalchemy.Channel):
    def _open(self) -> Any:
        hostname = self.connection.client.hostname
        path = sqlite_file(hostname)
        if path is None or hostname in self._engines:
            return super()._open()  # type: ignore[no-untyped-call]  # kombu is untyped
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # kombu checks for its tables and creates them in two steps under a thread lock only;
        # under this lock the check and the CREATE of one process cannot interleave with another's.
        with _creation_lock(path):
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
