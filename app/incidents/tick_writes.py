"""A tick's decisions written in short transactions, so that ingest never waits long for them.

One transaction for all of a tick's decisions held SQLite's write lock for as long as they took:
21 incidents opened at once (a flooding node's budget for 15 s) took 0.45-1.3 s on the 2-core
test machine, and every node's ingest commit waited that long (``benchmarks/flood.py``). So the
decisions are written ``CHUNK`` at a time, each chunk its own transaction, and a waiting ingest
commit goes between two of them (``app.core.write_turns``).

Every decision is written whole in one transaction (its incident, timeline, signal, plan and
alert together), as before; what a tick no longer promises is that all its decisions commit
together. If a later chunk fails, the earlier ones stay committed and the scheduler resyncs its
engine from the database (which then holds them), as after any failed tick; a decision whose
chunk failed is made again by the next tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.alerts.queue import took_queued_rows
from app.core.write_turns import WriteTurns, background_turn
from app.incidents.persist import PersistResult, persist_decisions
from app.models._types import utcnow
from app.policy.engine import IncidentDecision
from app.policy.policy_file import Policy

# Decisions per transaction: opening an incident is ~20 statements (a few ms each on a loaded
# host), so a chunk holds the write lock for tens of milliseconds, not for the whole tick.
CHUNK = 1


@dataclass(slots=True)
class TickWrites:
    persisted: PersistResult
    new_rows: bool  # actions or alert deliveries wait in the outbox: wake the dispatcher
    transactions: int


def write_decisions(
    engine: Engine,
    decisions: Sequence[IncidentDecision],
    *,
    policy: Policy,
    dry_run: bool,
    turns: WriteTurns | None = None,
    chunk: int = CHUNK,
) -> TickWrites:
    """Write ``decisions`` in order, ``chunk`` per transaction, all stamped with one time."""
    now = utcnow()
    total = PersistResult()
    new_rows = False
    transactions = 0
    for start in range(0, len(decisions), chunk):
        with background_turn(turns), Session(engine, expire_on_commit=False) as session:
            part = persist_decisions(
                session,
                decisions=decisions[start : start + chunk],
                policy=policy,
                now=now,
                dry_run=dry_run,
            )
            session.commit()
            new_rows = new_rows or bool(part.new_actions) or took_queued_rows(session)
        transactions += 1
        total.opened.extend(part.opened)
        total.resolved_keys.extend(part.resolved_keys)
        total.new_actions.extend(part.new_actions)
        total.approvals.extend(part.approvals)
    return TickWrites(total, new_rows, transactions)
