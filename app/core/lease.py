"""The scheduler lease: which server replica runs the scheduled jobs.

One row per lease in ``scheduler_lease`` (name, holder, expiry, fencing token). Taking or
renewing it is one conditional UPDATE, atomic on SQLite and PostgreSQL: it succeeds for the
holder, or for anyone once the lease has expired, and a new holder gets the next fencing token.
A write that must not land after a takeover checks the token in its own transaction
(:func:`lease_fence`). :class:`HeldLease` is one replica's view: it renews on time and stops
acting as the holder before the lease can expire under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session

from app.core.db import table_of
from app.models._types import utcnow
from app.models.action import SchedulerLease

log = logging.getLogger("rlguard.scheduler")

LEASE_NAME = "policy-scheduler"


def try_lease(engine: Engine, *, holder: str, ttl: float, name: str = LEASE_NAME) -> bool:
    """Take or renew the lease; True while ``holder`` has it."""
    now = utcnow()
    t = table_of(SchedulerLease)
    with Session(engine) as session:
        res = session.execute(
            sa.update(t)
            .where(t.c.name == name, sa.or_(t.c.holder == holder, t.c.expires_at < now))
            .values(
                holder=holder,
                expires_at=now + timedelta(seconds=ttl),
                fencing_token=sa.case(
                    (t.c.holder == holder, t.c.fencing_token), else_=t.c.fencing_token + 1
                ),
            )
        )
        if res.rowcount == 1:  # type: ignore[attr-defined]
            session.commit()
            return True
        exists = session.get(SchedulerLease, name) is not None
        if exists:
            return False
        try:
            session.add(
                SchedulerLease(
                    name=name,
                    holder=holder,
                    expires_at=now + timedelta(seconds=ttl),
                    fencing_token=1,
                )
            )
            session.commit()
            return True
        except IntegrityError:
            return False


def lease_token(engine: Engine, *, holder: str, name: str = LEASE_NAME) -> int | None:
    """The lease's fencing token while ``holder`` holds it (None otherwise)."""
    t = table_of(SchedulerLease)
    with engine.connect() as conn:
        row = conn.execute(sa.select(t.c.holder, t.c.fencing_token).where(t.c.name == name)).first()
    return int(row.fencing_token) if row is not None and row.holder == holder else None


def lease_fence(*, holder: str, token: int, name: str = LEASE_NAME) -> Callable[[Connection], bool]:
    """A check for a write transaction: does ``holder`` still hold the lease under ``token``?

    The lease row is read FOR UPDATE (on PostgreSQL; SQLite has one writer at a time anyway),
    so a replica taking the lease over waits until this transaction has ended and then sees
    everything it wrote; a takeover that committed first makes the check fail.
    """
    t = table_of(SchedulerLease)

    def holds(conn: Connection) -> bool:
        row = conn.execute(
            sa.select(t.c.holder, t.c.fencing_token).where(t.c.name == name).with_for_update()
        ).first()
        return row is not None and row.holder == holder and row.fencing_token == token

    return holds


def release_lease(engine: Engine, *, holder: str, name: str = LEASE_NAME) -> None:
    t = table_of(SchedulerLease)
    with Session(engine) as session:
        session.execute(sa.delete(t).where(t.c.name == name, t.c.holder == holder))
        session.commit()


class HeldLease:
    """One replica's hold on the lease: :meth:`renew` before acting, :meth:`held` to ask."""

    def __init__(self, engine: Engine, *, holder: str, seconds: float) -> None:
        self.engine = engine
        self.holder = holder
        self.seconds = seconds
        self._held_until = 0.0
        self._renew_after = 0.0

    def held(self) -> bool:
        """Whether this replica holds the lease now (it stops acting at 80 % of the lease, so
        that it never acts on one another replica may already have taken over)."""
        return time.monotonic() < self._held_until

    def renew(self) -> tuple[bool, bool]:
        """Take or renew the lease, writing it only once a third of it has passed; returns
        ``(held, newly_taken)``.

        Renewing on every tick made each tick an fsync'd write that queued for SQLite's one
        write lock behind ingest commits: most of a tick's time, and what made it overrun its
        interval on a busy disk. The holder still renews well before the lease can expire.
        """
        started = time.monotonic()
        if self.held() and started < self._renew_after:
            return True, False
        try:
            ok = try_lease(self.engine, holder=self.holder, ttl=self.seconds)
        except SQLAlchemyError as exc:
            log.warning("scheduler lease not renewed: %s", exc)
            ok = False
        if not ok:
            self._held_until = 0.0
            return False, False
        taken = not self.held()
        if taken:
            log.info("scheduler lease taken by %s", self.holder)
        self._held_until = started + self.seconds * 0.8
        self._renew_after = started + self.seconds / 3
        return True, taken

    def token(self) -> int | None:
        """The fencing token while this replica holds the lease (None otherwise)."""
        return lease_token(self.engine, holder=self.holder) if self.held() else None

    def fence(self, token: int) -> Callable[[Connection], bool]:
        return lease_fence(holder=self.holder, token=token)

    def release(self) -> None:
        try:
            release_lease(self.engine, holder=self.holder)
        except SQLAlchemyError as exc:
            log.warning("scheduler lease not released: %s", exc)
