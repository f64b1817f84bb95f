"""Leadership leases for the checkpoint coordinator, held in Redis or PostgreSQL.

A coordinator is the leader while it holds the lease; it renews well inside the TTL and steps
down the moment a renewal fails. A standby keeps trying to acquire, so when the leader dies the
standby takes over at most one TTL later. Each acquisition bumps an ``epoch`` (a fencing token),
and the coordinator's durable state (global version, last round) is written through
:meth:`Lease.publish`, which succeeds only while the writer still holds the lease: a deposed
leader that wakes up late cannot overwrite its successor's state. No home-made consensus: the
store's own atomic operations decide.

Drivers (``redis``, ``psycopg``) are imported lazily inside each implementation, so the library
does not depend on either unless that backend is used.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from recovery.checkpoint.errors import CheckpointInputError, LeaseError

log = logging.getLogger("rlguard.recovery.lease")


@dataclass(frozen=True)
class LeaseGrant:
    """A successful acquisition: who holds the lease and its fencing epoch."""

    holder: str
    epoch: int


class Lease(Protocol):
    """What the coordinator needs from a leadership lease backend."""

    name: str
    ttl: float

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        """Take the lease if it is free or expired (or already ours); None when someone holds it."""

    def renew(self, holder: str) -> bool:
        """Extend our lease by ``ttl``; False if we no longer hold it (step down at once)."""

    def release(self, holder: str) -> None:
        """Give the lease up early if we hold it, so a standby need not wait for the TTL."""

    def current_holder(self) -> str | None:
        """Who holds the lease now (None: nobody, or expired)."""

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        """Store the leader's state, only if ``holder`` still holds the lease."""

    def read_state(self) -> dict[str, Any] | None:
        """The last state a leader published (None: never)."""

    def close(self) -> None:
        """Drop the connection."""


def _check(name: str, ttl: float, timeout: float) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", name):
        raise CheckpointInputError(f"lease name must be 1-128 of [A-Za-z0-9_.:-], got {name!r}")
    if not (0 < ttl <= 3600):
        raise CheckpointInputError(f"lease ttl must be in (0, 3600] seconds, got {ttl!r}")
    if not (0 < timeout <= ttl):
        raise CheckpointInputError(f"lease timeout must be in (0, ttl], got {timeout!r}")


def _check_holder(holder: str) -> None:
    if not isinstance(holder, str) or not holder or len(holder) > 256:
        raise CheckpointInputError(f"lease holder must be a non-empty string, got {holder!r}")


# Compare-and-set scripts: each runs atomically inside Redis.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_PUBLISH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
"""


class RedisLease:
    """A lease as a Redis key: ``SET key holder NX PX ttl``, renewed by a compare-and-set script.

    The epoch is an ``INCR`` counter bumped on each acquisition; the published state is a plain
    key written by a script that first checks the holder. Every call carries ``timeout`` as the
    socket timeout.
    """

    def __init__(self, url: str, *, name: str, ttl: float = 10.0, timeout: float = 2.0) -> None:
        _check(name, ttl, timeout)
        import redis

        self.name = name
        self.ttl = ttl
        self._key = f"rlguard:lease:{name}"
        self._epoch_key = f"{self._key}:epoch"
        self._state_key = f"{self._key}:state"
        self._client = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=True
        )
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        self._publish = self._client.register_script(_PUBLISH)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import redis

        try:
            return fn(*args, **kwargs)
        except redis.RedisError as exc:
            raise LeaseError(f"redis lease {self.name!r}: {what} failed: {exc}") from exc

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        """See :class:`Lease`."""
        _check_holder(holder)
        ttl_ms = int(self.ttl * 1000)
        if self._call("acquire", self._client.set, self._key, holder, nx=True, px=ttl_ms):
            epoch = int(self._call("epoch", self._client.incr, self._epoch_key))
            return LeaseGrant(holder, epoch)
        if self.renew(holder):
            epoch = int(self._call("epoch", self._client.get, self._epoch_key) or 0)
            return LeaseGrant(holder, epoch)
        return None

    def renew(self, holder: str) -> bool:
        """See :class:`Lease`."""
        _check_holder(holder)
        ttl_ms = int(self.ttl * 1000)
        return bool(self._call("renew", self._renew, keys=[self._key], args=[holder, ttl_ms]))

    def release(self, holder: str) -> None:
        """See :class:`Lease`."""
        _check_holder(holder)
        self._call("release", self._release, keys=[self._key], args=[holder])

    def current_holder(self) -> str | None:
        """See :class:`Lease`."""
        value = self._call("read", self._client.get, self._key)
        return str(value) if value is not None else None

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        """See :class:`Lease`."""
        _check_holder(holder)
        payload = json.dumps(state, sort_keys=True)
        keys = [self._key, self._state_key]
        return bool(self._call("publish", self._publish, keys=keys, args=[holder, payload]))

    def read_state(self) -> dict[str, Any] | None:
        """See :class:`Lease`."""
        raw = self._call("read state", self._client.get, self._state_key)
        return None if raw is None else dict(json.loads(raw))

    def close(self) -> None:
        """See :class:`Lease`."""
        self._client.close()


_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS rlguard_leases (
    name text PRIMARY KEY,
    holder text NOT NULL,
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    state jsonb
)
"""


class PostgresLease:
    """A lease as a row of ``rlguard_leases`` with an expiry, changed in single-statement
    transactions and judged by the database's clock.

    Why a row and not ``pg_advisory_lock``: an advisory lock belongs to a session, so it is held
    as long as the TCP connection looks alive. A leader that hangs (GC pause, stuck NFS write)
    with its connection open keeps the lock forever, and one behind a network partition keeps it
    until TCP keepalive gives up (minutes by default) — there is no TTL to bound takeover. The lock
    carries no holder name, no fencing epoch and no state, and it silently breaks behind a
    transaction-mode connection pooler. A row with ``expires_at`` compared against the server's
    ``clock_timestamp()`` bounds takeover by the TTL regardless of the leader's health, needs no
    synchronised clocks between coordinators, names the holder, and lets ``publish`` be fenced by
    the same ``WHERE holder = … AND expires_at > now`` condition.

    ``dsn`` is a libpq URL; a SQLAlchemy-style ``postgresql+psycopg://`` is accepted too.
    ``timeout`` bounds connecting and each statement (``statement_timeout``).
    """

    def __init__(self, dsn: str, *, name: str, ttl: float = 10.0, timeout: float = 2.0) -> None:
        _check(name, ttl, timeout)
        self.name = name
        self.ttl = ttl
        self._dsn = re.sub(r"^postgresql\+\w+://", "postgresql://", dsn)
        self._timeout = timeout
        self._conn: Any = None
        try:
            self._execute(_TABLE_DDL, ())
        except LeaseError:
            # Two coordinators starting together can collide inside CREATE TABLE IF NOT EXISTS
            # (a unique violation on the catalog); the second attempt sees the table.
            self._execute(_TABLE_DDL, ())

    def _connect(self) -> Any:
        import psycopg

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                connect_timeout=max(1, int(self._timeout + 0.999)),
                options=f"-c statement_timeout={int(self._timeout * 1000)}",
            )
        return self._conn

    def _execute(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            with self._connect().cursor() as cur:
                cur.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        except psycopg.Error as exc:
            # Drop the connection: the next call reconnects instead of reusing a broken session.
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            raise LeaseError(f"postgres lease {self.name!r} failed: {exc}") from exc

    def try_acquire(self, holder: str) -> LeaseGrant | None:
        """See :class:`Lease`."""
        _check_holder(holder)
        rows = self._execute(
            """
            INSERT INTO rlguard_leases (name, holder, epoch, expires_at)
            VALUES (%s, %s, 1, clock_timestamp() + %s * interval '1 second')
            ON CONFLICT (name) DO UPDATE
               SET holder = EXCLUDED.holder,
                   epoch = CASE WHEN rlguard_leases.holder = EXCLUDED.holder
                                 AND rlguard_leases.expires_at > clock_timestamp()
                                THEN rlguard_leases.epoch ELSE rlguard_leases.epoch + 1 END,
                   expires_at = EXCLUDED.expires_at
             WHERE rlguard_leases.expires_at <= clock_timestamp()
                OR rlguard_leases.holder = EXCLUDED.holder
            RETURNING epoch
            """,
            (self.name, holder, self.ttl),
        )
        return LeaseGrant(holder, int(rows[0][0])) if rows else None

    def renew(self, holder: str) -> bool:
        """See :class:`Lease`."""
        _check_holder(holder)
        rows = self._execute(
            """
            UPDATE rlguard_leases SET expires_at = clock_timestamp() + %s * interval '1 second'
             WHERE name = %s AND holder = %s AND expires_at > clock_timestamp()
            RETURNING epoch
            """,
            (self.ttl, self.name, holder),
        )
        return bool(rows)

    def release(self, holder: str) -> None:
        """See :class:`Lease`."""
        _check_holder(holder)
        self._execute(
            """
            UPDATE rlguard_leases SET expires_at = clock_timestamp() - interval '1 millisecond'
             WHERE name = %s AND holder = %s AND expires_at > clock_timestamp()
            """,
            (self.name, holder),
        )

    def current_holder(self) -> str | None:
        """See :class:`Lease`."""
        rows = self._execute(
            "SELECT holder FROM rlguard_leases WHERE name = %s AND expires_at > clock_timestamp()",
            (self.name,),
        )
        return str(rows[0][0]) if rows else None

    def publish(self, holder: str, state: dict[str, Any]) -> bool:
        """See :class:`Lease`."""
        _check_holder(holder)
        rows = self._execute(
            """
            UPDATE rlguard_leases SET state = %s::jsonb
             WHERE name = %s AND holder = %s AND expires_at > clock_timestamp()
            RETURNING 1
            """,
            (json.dumps(state, sort_keys=True), self.name, holder),
        )
        return bool(rows)

    def read_state(self) -> dict[str, Any] | None:
        """See :class:`Lease`."""
        rows = self._execute("SELECT state FROM rlguard_leases WHERE name = %s", (self.name,))
        if not rows or rows[0][0] is None:
            return None
        value = rows[0][0]
        return dict(json.loads(value) if isinstance(value, str) else value)

    def close(self) -> None:
        """See :class:`Lease`."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
