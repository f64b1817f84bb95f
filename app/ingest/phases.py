"""Phase transitions on the ingest hot path: notice a change, write it with the batch.

Agents report every participant's current phase about once a second; almost every report
repeats the phase already known. :class:`PhaseTracker` keeps the last phase per (job, role,
rank) in memory, so a report costs one dict lookup and one string comparison, and only a change
(or a participant's first report) yields a :class:`PhaseChange`. The changes ride in the ingest
group (``IngestGroup.phases``) and are inserted by the same database transaction as the batch's
other durable effects and its dedupe cursor (``write_phase_changes``), so the guarantees in
``app.ingest.pipeline`` hold for them too: a batch acknowledged has its transitions stored; a
batch lost by a crash before its commit is re-sent by the agent, and since the tracker is seeded
at start from the ``participant`` table (which that lost commit did not reach either), the
change is noticed again.

Reports older than the newest one known for a participant are ignored (a late spool replay does
not draw a phase that ended long ago as the current one). The same change delivered twice (two
replicas, a replay) hits the table's unique key and is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from app.core.db import dialect_insert, table_of
from app.models import Participant, from_epoch
from app.models.phase import PhaseTransition

PRUNE_EVERY_SECONDS = 3600.0

ParticipantKey = tuple[str, str, int]


@dataclass(slots=True, frozen=True)
class PhaseChange:
    job: str
    role: str
    rank: int
    node: str
    phase: str
    previous: str | None  # None: the participant's first report
    step: int
    ts: float


class PhaseTracker:
    """The last reported phase (and its report time) of every participant."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[ParticipantKey, tuple[str, float]] = {}

    def seed(self, rows: Iterable[tuple[str, str, int, str, float]]) -> None:
        """Start from what the database holds: ``(job, role, rank, phase, ts)`` rows."""
        for job, role, rank, phase, ts in rows:
            self._last[(job, role, rank)] = (phase, ts)

    def observe(
        self, job: str, role: str, rank: int, node: str, phase: str, step: int, ts: float
    ) -> PhaseChange | None:
        """Record one report; returns the change it makes, if any."""
        key = (job, role, rank)
        last = self._last.get(key)
        if last is None:
            self._last[key] = (phase, ts)
            return PhaseChange(job, role, rank, node, phase, None, step, ts)
        known, known_ts = last
        if ts < known_ts:
            return None
        if known == phase:
            if ts > known_ts:
                self._last[key] = (phase, ts)
            return None
        self._last[key] = (phase, ts)
        return PhaseChange(job, role, rank, node, phase, known, step, ts)

    def __len__(self) -> int:
        return len(self._last)


def load_tracker(engine: Engine) -> PhaseTracker:
    """A tracker seeded with every participant's last committed phase (blocking: a thread)."""
    t = table_of(Participant)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.job_name, t.c.role, t.c.rank, t.c.phase, t.c.last_heartbeat_at)
        ).all()
    tracker = PhaseTracker()
    tracker.seed((r[0], r[1], r[2], r[3], r[4].timestamp()) for r in rows)
    return tracker


class _Insert:
    """The insert, built once per dialect (as the group commit's other statements are)."""

    def __init__(self, dialect: str) -> None:
        table = table_of(PhaseTransition)
        self.statement = dialect_insert(dialect, table).on_conflict_do_nothing(
            index_elements=["job_name", "role", "rank", "at"]
        )
        self.prune = sa.delete(table).where(table.c.at < sa.bindparam("b_cutoff"))


_INSERTS: dict[str, _Insert] = {}


def _statements(conn: Connection) -> _Insert:
    dialect = conn.dialect.name
    st = _INSERTS.get(dialect)
    if st is None:
        st = _INSERTS[dialect] = _Insert(dialect)
    return st


def write_phase_changes(conn: Connection, changes: list[PhaseChange]) -> None:
    """Insert ``changes`` inside the caller's transaction (after the jobs they refer to)."""
    if not changes:
        return
    conn.execute(
        _statements(conn).statement,
        [
            {
                "job_name": c.job,
                "role": c.role,
                "rank": c.rank,
                "node_name": c.node,
                "phase": c.phase,
                "previous_phase": c.previous,
                "step": c.step,
                "at": from_epoch(c.ts),
            }
            for c in changes
        ],
    )


class PhaseRetention:
    """Deletes transitions older than ``retention_days``, at most once per ``every`` seconds.

    Called from the group commit: it is one indexed delete per hour, and running it where the
    rows are written needs no scheduler of its own.
    """

    def __init__(
        self,
        *,
        retention_days: float,
        every: float = PRUNE_EVERY_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retention_days > 0 or not every > 0:
            raise ValueError(
                f"retention_days and every must be positive, got {retention_days!r}, {every!r}"
            )
        self.retention = timedelta(days=retention_days)
        self.every = every
        self._monotonic = monotonic
        self._last: float | None = None

    def prune_if_due(self, conn: Connection, *, now: datetime) -> int | None:
        """Delete expired rows if due; returns how many were deleted (None: not due)."""
        clock = self._monotonic()
        if self._last is not None and clock - self._last < self.every:
            return None
        result = conn.execute(_statements(conn).prune, {"b_cutoff": now - self.retention})
        self._last = clock
        return int(result.rowcount or 0)
