"""Recording training progress on the ingest hot path: one row per change of a role's step.

The ledger needs to know, to the second, when a job completed a step (above all the first one
after a recovery). Agents report every participant's step about once a second, and almost every
report repeats the step already known, so :class:`StepTracker` keeps the last step of each
role's rank 0 in memory (one dict lookup per report) and yields a :class:`StepChange` only when
it moves. Changes ride in the ingest group and are written by the same transaction as the
batch's other effects (``write_step_changes``), with the guarantees of ``app.ingest.pipeline``:
a lost commit is re-sent by the agent, and the tracker, seeded from the ``participant`` table
(which that commit did not reach either), notices the change again.

Only rank 0 is recorded: data-parallel ranks move in lock-step, and one row per step per role
keeps the table small for a 1,000-GPU job. A step that goes down (a restore from an older
checkpoint) is a change like any other: the ledger reads it as the start of redone work.
So a process that has no step of its own yet is not heard: while it is starting (``STARTING``,
its launcher vouching for it, or ``INIT``, before it resumed) the agent reports step 0 (the
wire's step is a count), and a restarted trainer's 0 read as a restore would count every step
since the job began as redone (a TRL drill reported 22 steps redone for a resume from step 21).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from app.core.db import dialect_insert, table_of
from app.models import Participant, from_epoch
from app.models.progress import StepProgress
from recovery.report import START_PHASES

#: The rank whose step stands for its role.
RECORDED_RANK = 0


@dataclass(slots=True, frozen=True)
class StepChange:
    job: str
    role: str
    rank: int
    step: int
    ts: float


class StepTracker:
    """The last reported step (and its report time) of every role's rank 0."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[int, float]] = {}

    def seed(self, rows: Iterable[tuple[str, str, int, float]]) -> None:
        """Start from what the database holds: ``(job, role, step, ts)`` rows."""
        for job, role, step, ts in rows:
            self._last[(job, role)] = (step, ts)

    def observe(
        self, job: str, role: str, rank: int, step: int, ts: float, *, phase: str | None = None
    ) -> StepChange | None:
        """Record one report; returns the change it makes, if any."""
        if rank != RECORDED_RANK or phase in START_PHASES:
            return None
        key = (job, role)
        last = self._last.get(key)
        if last is not None:
            known, known_ts = last
            if ts < known_ts:
                return None  # a late replay does not rewrite the present
            if known == step:
                if ts > known_ts:
                    self._last[key] = (step, ts)
                return None
        self._last[key] = (step, ts)
        return StepChange(job, role, rank, step, ts)


def load_step_tracker(engine: Engine) -> StepTracker:
    """A tracker seeded with every rank 0's last committed step (blocking: a thread)."""
    t = table_of(Participant)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(t.c.job_name, t.c.role, t.c.step, t.c.last_heartbeat_at).where(
                t.c.rank == RECORDED_RANK
            )
        ).all()
    tracker = StepTracker()
    tracker.seed((r[0], r[1], r[2], r[3].timestamp()) for r in rows)
    return tracker


_TABLE = table_of(StepProgress)
_INSERTS: dict[str, Any] = {}


def _insert(dialect: str) -> Any:
    st = _INSERTS.get(dialect)
    if st is None:
        st = _INSERTS[dialect] = dialect_insert(dialect, _TABLE).on_conflict_do_nothing(
            index_elements=["job_name", "role", "rank", "at"]
        )
    return st


def write_step_changes(conn: Connection, changes: list[StepChange]) -> None:
    """Insert ``changes`` inside the caller's transaction (after the jobs they refer to)."""
    if not changes:
        return
    conn.execute(
        _insert(conn.dialect.name),
        [
            {
                "job_name": c.job,
                "role": c.role,
                "rank": c.rank,
                "step": c.step,
                "at": from_epoch(c.ts),
            }
            for c in changes
        ],
    )


def prune_step_progress(conn: Connection, *, before: datetime) -> int:
    """Delete rows older than ``before`` (with the phase transitions' retention)."""
    result = conn.execute(sa.delete(_TABLE).where(_TABLE.c.at < before))
    return int(result.rowcount or 0)
