"""The database side of ingest: one transaction per group of acknowledged-to-be batches.

``write_ingest_group`` upserts, in ONE transaction, the dedupe cursors of every batch in the group
together with the batches' durable effects (node last-seen and fingerprint, jobs, participants).
Either all of it commits or none of it does, so a batch is never recorded as applied without its
effects, nor its effects written without it being recorded. A failure is noted with the part of
the group being written (``part_of``), so a batch rejected alone can be told which field failed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from app.core.db import dialect_insert, table_of
from app.ingest.dedupe import WINDOW, DedupeWindow
from app.ingest.phases import PhaseChange, PhaseRetention, write_phase_changes
from app.ingest.step_progress import StepChange, prune_step_progress, write_step_changes
from app.models import IngestCursor, Job, Node, Participant, from_epoch, utcnow


@dataclass(slots=True)
class NodeSeen:
    agent_id: str
    seen_at: datetime
    fingerprint: dict[str, str] | None = None


@dataclass(slots=True)
class ParticipantSeen:
    node: str
    phase: str
    step: int
    ts: float


@dataclass(slots=True)
class IngestGroup:
    """What one commit writes: latest state per key (later batches overwrite earlier ones)."""

    cursors: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    nodes: dict[str, NodeSeen] = field(default_factory=dict)
    jobs: dict[str, datetime] = field(default_factory=dict)
    participants: dict[tuple[str, str, int], ParticipantSeen] = field(default_factory=dict)
    phases: list[PhaseChange] = field(default_factory=list)  # in the order they were noticed
    steps: list[StepChange] = field(default_factory=list)  # app.ingest.step_progress

    def __bool__(self) -> bool:
        return bool(
            self.cursors
            or self.nodes
            or self.jobs
            or self.participants
            or self.phases
            or self.steps
        )


def fingerprint_hash(fp: dict[str, str]) -> str:
    return hashlib.sha256(orjson.dumps(fp, option=orjson.OPT_SORT_KEYS)).hexdigest()


_WINDOW_BITS = (1 << WINDOW) - 1


def _shifted(mask: Any, by: Any) -> Any:
    """``mask << by`` in SQL, 0 once every bit is shifted out (the window is 63 bits)."""
    small = sa.cast(sa.case((by >= WINDOW, WINDOW), else_=by), sa.Integer)
    return sa.case((by >= WINDOW, sa.literal(0, sa.BigInteger)), else_=mask.op("<<")(small))


class _Statements:
    """The group commit's statements, built once per dialect (building and cache-keying a
    statement costs more than executing it for a small group)."""

    def __init__(self, dialect: str) -> None:
        node_t = table_of(Node)
        job_i = dialect_insert(dialect, table_of(Job))
        self.jobs = job_i.on_conflict_do_update(
            index_elements=["name"], set_={"last_seen_at": job_i.excluded.last_seen_at}
        )
        self.nodes = (
            sa.update(node_t)
            .where(node_t.c.name == sa.bindparam("b_name"))
            .values(last_seen_at=sa.bindparam("b_seen"), last_agent_id=sa.bindparam("b_agent"))
        )
        self.fingerprints = (
            sa.update(node_t)
            .where(node_t.c.name == sa.bindparam("b_name"))
            .values(fingerprint=sa.bindparam("b_fp"), fingerprint_hash=sa.bindparam("b_h"))
        )
        part_t = table_of(Participant)
        part_i = dialect_insert(dialect, part_t)
        self.participants = part_i.on_conflict_do_update(
            index_elements=["job_name", "role", "rank"],
            set_={
                c: getattr(part_i.excluded, c)
                for c in ("node_name", "phase", "step", "last_heartbeat_at", "updated_at")
            },
            # A late report (a spool replay, another replica's older batch) never rolls the
            # current phase back; the phase tracker is seeded from these rows at start.
            where=part_i.excluded.last_heartbeat_at >= part_t.c.last_heartbeat_at,
        )
        cur_t = table_of(IngestCursor)
        cur_i = dialect_insert(dialect, cur_t)
        # Merge, never overwrite: with several server replicas each writes its own view of an
        # agent's window, and the row must end up holding every seq any of them committed.
        old_h, new_h = cur_t.c.high_seq, cur_i.excluded.high_seq
        old_m, new_m = cur_t.c.window_mask, cur_i.excluded.window_mask
        greatest = sa.func.greatest if dialect == "postgresql" else sa.func.max
        self.cursors = cur_i.on_conflict_do_update(
            index_elements=["node_name", "agent_id"],
            set_={
                "high_seq": greatest(old_h, new_h),
                "window_mask": sa.case(
                    (new_h >= old_h, new_m.op("|")(_shifted(old_m, new_h - old_h))),
                    else_=old_m.op("|")(_shifted(new_m, old_h - new_h)),
                ).op("&")(_WINDOW_BITS),
                "updated_at": cur_i.excluded.updated_at,
            },
        )


_STATEMENTS: dict[str, _Statements] = {}


def write_ingest_group(
    engine: Engine, group: IngestGroup, *, phase_retention: PhaseRetention | None = None
) -> None:
    with engine.begin() as conn:
        write_ingest_group_in(conn, group, phase_retention=phase_retention)


def write_ingest_group_in(
    conn: Connection, group: IngestGroup, *, phase_retention: PhaseRetention | None = None
) -> None:
    """``write_ingest_group`` inside the caller's transaction (the loop committer's, which
    runs it on an asyncio connection: ``app.ingest.commit.postgres_loop``)."""
    dialect = conn.dialect.name
    st = _STATEMENTS.get(dialect)
    if st is None:
        st = _STATEMENTS[dialect] = _Statements(dialect)
    now = utcnow()
    _write(conn, st, group, now)
    if phase_retention is not None:
        if phase_retention.prune_if_due(conn, now=now) is not None:
            prune_step_progress(conn, before=now - phase_retention.retention)


_PART_NOTE = "rlguard ingest part: "


@contextmanager
def _writing(part: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        exc.add_note(_PART_NOTE + part)
        raise


def part_of(exc: BaseException) -> str | None:
    """The part of the group (jobs, nodes, fingerprint, participants, phases, steps, cursors)
    whose write raised ``exc``, or None when it did not come from ``write_ingest_group``."""
    for note in getattr(exc, "__notes__", ()):
        if note.startswith(_PART_NOTE):
            return str(note[len(_PART_NOTE) :])
    return None


def _write(conn: Connection, st: _Statements, group: IngestGroup, now: datetime) -> None:
    if group.jobs:
        with _writing("jobs"):
            conn.execute(
                st.jobs,
                [{"name": n, "created_at": now, "last_seen_at": t} for n, t in group.jobs.items()],
            )
    if group.nodes:
        with _writing("nodes"):
            conn.execute(
                st.nodes,
                [
                    {"b_name": n, "b_seen": s.seen_at, "b_agent": s.agent_id}
                    for n, s in group.nodes.items()
                ],
            )
        with_fp = [(n, s.fingerprint) for n, s in group.nodes.items() if s.fingerprint]
        if with_fp:
            with _writing("fingerprint"):
                conn.execute(
                    st.fingerprints,
                    [{"b_name": n, "b_fp": fp, "b_h": fingerprint_hash(fp)} for n, fp in with_fp],
                )
    if group.participants:
        with _writing("participants"):
            _write_participants(conn, st, group, now)
    # After the jobs (the rows refer to them), in the same transaction as the cursors.
    with _writing("phases"):
        write_phase_changes(conn, group.phases)
    with _writing("steps"):
        write_step_changes(conn, group.steps)
    if group.cursors:
        with _writing("cursors"):
            _write_cursors(conn, st, group, now)


def _write_participants(
    conn: Connection, st: _Statements, group: IngestGroup, now: datetime
) -> None:
    conn.execute(
        st.participants,
        [
            {
                "job_name": job,
                "role": role,
                "rank": rank,
                "node_name": p.node,
                "phase": p.phase,
                "step": p.step,
                "last_heartbeat_at": from_epoch(p.ts),
                "updated_at": now,
            }
            for (job, role, rank), p in group.participants.items()
        ],
    )


def _write_cursors(conn: Connection, st: _Statements, group: IngestGroup, now: datetime) -> None:
    conn.execute(
        st.cursors,
        [
            {
                "node_name": node,
                "agent_id": agent,
                "high_seq": high,
                "window_mask": mask,
                "updated_at": now,
            }
            for (node, agent), (high, mask) in group.cursors.items()
        ],
    )


def load_cursors(
    engine: Engine, *, forget_before: datetime | None = None
) -> dict[tuple[str, str], DedupeWindow]:
    """All agents' dedupe windows; those not updated since ``forget_before`` are deleted first."""
    cursor_t = table_of(IngestCursor)
    if forget_before is not None:
        with engine.begin() as conn:
            conn.execute(sa.delete(cursor_t).where(cursor_t.c.updated_at < forget_before))
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                cursor_t.c.node_name,
                cursor_t.c.agent_id,
                cursor_t.c.high_seq,
                cursor_t.c.window_mask,
            )
        ).all()
    return {(r[0], r[1]): DedupeWindow(r[2], r[3]) for r in rows}
