"""What the group committer commits, and what it does when a group cannot be committed.

Each accepted batch is queued as a ``QueuedBatch`` (its own durable effects, nothing merged);
a commit merges the queued batches into one ``IngestGroup`` (``group_of``) and writes it in one
transaction. A group mixes batches from every node, so one batch the database refuses would
fail every batch with it, on every retry, and stop ingest for the whole cluster. So a failed
group is classified (``is_transient``):

* the database or Redis itself failed (connection lost, locked, timed out): the group is kept
  whole and retried later; its requests get 503 after ``commit_timeout_seconds``;
* anything else is caused by the data of some batch and would fail again, so ``isolate``
  bisects the group: halves that commit are done, a half that fails is split again, and a single
  batch that fails alone is rejected with the reason (the request gets 422) and never retried.

Validation (``ingest_validation``) bounds every field to what the databases hold, so a rejection
here means validation has a gap; the rejection counter makes that visible instead of an outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy.exc as sa_exc
from redis.exceptions import RedisError

from app.ingest.dedupe import DedupeWindow
from app.ingest.persist import IngestGroup, NodeSeen, ParticipantSeen, part_of
from app.ingest.phases import PhaseChange
from app.ingest.step_progress import StepChange
from app.series.backend import ParticipantHeartbeat, Sample
from recovery.protocol.samples import ParticipantReport

log = logging.getLogger("rlguard.ingest")

# The body field each part of the group write comes from (``ingest_persist`` notes the part on a
# failure), so a rejection names the field.
_FIELD_OF_PART = {
    "jobs": "participants[].job",
    "nodes": "node",
    "fingerprint": "fingerprint",
    "participants": "participants",
    "phases": "participants[].phase",
    "steps": "participants[].step",
    "cursors": "seq",
}


@dataclass(slots=True)
class QueuedBatch:
    """One accepted batch's durable effects, waiting for the group commit."""

    node: str
    agent_id: str
    seq: int
    version: int  # the agent's version after this batch was marked (see IngestService)
    seen_at: datetime
    fingerprint: dict[str, str] | None
    participants: list[ParticipantReport]
    phases: list[PhaseChange]  # the changes the phase tracker noticed in this batch, in order
    steps: list[StepChange]  # the progress the step tracker noticed (app.ingest.step_progress)
    samples: list[Sample] = field(default_factory=list)  # only with a shared series backend
    shared: list[ParticipantHeartbeat] = field(default_factory=list)
    certain: bool = False  # carries a certain fault (app.ingest.certain): tell once committed


@dataclass(slots=True)
class Rejection:
    batch: QueuedBatch
    field: str  # the body field the failing write came from, or "batch" when unknown
    reason: str  # the message for the client


@dataclass(slots=True)
class IsolationOutcome:
    """Every batch ends in exactly one list; ``committed`` and ``rejected`` together are a prefix
    of the group in queue order, ``unresolved`` the rest (after a transient failure)."""

    committed: list[QueuedBatch] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    unresolved: list[QueuedBatch] = field(default_factory=list)
    transient: BaseException | None = None
    commits: int = 0


def group_of(batches: Sequence[QueuedBatch]) -> IngestGroup:
    """The merged effects of ``batches`` (in queue order; later state wins key by key).

    An agent's cursor is the window of exactly the seqs in ``batches``: the database merges it
    into what it holds, so a seq is recorded as applied only by the commit of its own batch."""
    group = IngestGroup()
    windows: dict[tuple[str, str], DedupeWindow] = {}
    for b in batches:
        key = (b.node, b.agent_id)
        window = windows.get(key)
        if window is None:
            window = windows[key] = DedupeWindow()
        window.mark(b.seq)
        node = group.nodes.get(b.node)
        if node is None:
            group.nodes[b.node] = NodeSeen(b.agent_id, b.seen_at, b.fingerprint)
        else:
            node.agent_id, node.seen_at = b.agent_id, b.seen_at
            if b.fingerprint is not None:
                node.fingerprint = b.fingerprint
        for p in b.participants:
            group.jobs[p.job] = b.seen_at
            pkey = (p.job, p.role, p.rank)
            known = group.participants.get(pkey)
            if known is None or known.ts <= p.ts:
                group.participants[pkey] = ParticipantSeen(b.node, p.phase, p.step, p.ts)
        group.phases.extend(b.phases)
        group.steps.extend(b.steps)
    group.cursors = {k: (w.high_seq, w.window_mask) for k, w in windows.items()}
    return group


def is_transient(exc: BaseException) -> bool:
    """True when the database or Redis failed (the same group may commit later); False when the
    data did (some batch in the group fails the same way every time)."""
    if isinstance(exc, RedisError | OSError | TimeoutError):
        return True
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return True  # the pool lost a connection or had none to give
    if isinstance(exc, sa_exc.DBAPIError):
        # OperationalError: connection lost, server shutting down, locked, deadlock,
        # serialization failure, disk full; InterfaceError: the connection itself is unusable.
        return exc.connection_invalidated or isinstance(
            exc, sa_exc.OperationalError | sa_exc.InterfaceError
        )
    return False


def rejection_of(batch: QueuedBatch, exc: BaseException) -> Rejection:
    """A client-facing reason for ``batch``, which failed alone with ``exc``."""
    part = part_of(exc)
    where = _FIELD_OF_PART.get(part or "", "batch")
    detail = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    text = (str(detail).strip().splitlines() or [""])[0]
    if len(text) > 160:
        text = text[:157] + "..."
    reason = (
        f"{where}: the database cannot store this batch ({type(detail).__name__}: {text}); "
        f"batch seq {batch.seq} was not applied and must not be retried"
    )
    return Rejection(batch, where, reason)


def isolate(
    batches: Sequence[QueuedBatch], commit: Callable[[Sequence[QueuedBatch]], None]
) -> IsolationOutcome:
    """Commit what can be committed of ``batches``, whose group commit failed deterministically.

    Bisects: each half is committed on its own (``commit`` is one transaction), a failing half
    is split again, a single failing batch is rejected. A transient failure stops the search and
    leaves the rest unresolved (retried whole later). At most about 2 log2(n) commits per bad
    batch."""
    out = IsolationOutcome()
    _split(list(batches), commit, out)
    return out


def _split(
    batches: list[QueuedBatch],
    commit: Callable[[Sequence[QueuedBatch]], None],
    out: IsolationOutcome,
) -> None:
    if len(batches) == 1:
        _try(batches, commit, out)
        return
    mid = len(batches) // 2
    _try(batches[:mid], commit, out)
    _try(batches[mid:], commit, out)


def _try(
    batches: list[QueuedBatch],
    commit: Callable[[Sequence[QueuedBatch]], None],
    out: IsolationOutcome,
) -> None:
    if out.transient is not None:
        out.unresolved.extend(batches)
        return
    try:
        out.commits += 1
        commit(batches)
    except Exception as exc:
        if is_transient(exc):
            out.transient = exc
            out.unresolved.extend(batches)
        elif len(batches) == 1:
            rejection = rejection_of(batches[0], exc)
            log.error(
                "ingest batch rejected at commit: %s",
                rejection.reason,
                extra={"node": batches[0].node, "agent_id": batches[0].agent_id},
            )
            out.rejected.append(rejection)
        else:
            _split(batches, commit, out)
        return
    out.committed.extend(batches)
