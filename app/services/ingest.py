"""Ingest: validate a batch, apply it to the series store once, acknowledge it once it is durable.

How "acknowledged only after it is in the series store" and "a duplicate is refused also after a
restart" fit together:

1. A request is validated (``ingest_validation``) and checked against its agent's dedupe window
   (``ingest_dedupe``), all on the event loop with no ``await`` in between, so two deliveries of
   one (node, agent, seq) can never both pass.
2. A new batch is appended to the in-memory ``SeriesStore`` at once (the policy engine sees it on
   its next tick), its seq is marked in the in-memory window, and its durable effects (node
   last-seen and fingerprint, jobs, participants' phase/step/heartbeat, and the phase changes
   ``ingest_phases.PhaseTracker`` noticed) plus the agent's new
   window are queued for the group committer.
3. The group committer writes everything queued so far in ONE database transaction
   (``ingest_persist.write_ingest_group``), then resolves the waiting requests. Only then is
   ``{"accepted": N, "duplicate": false}`` sent. Concurrent requests share one commit (and one
   fsync), which is what keeps the hot path fast.
4. A delivery whose seq is already marked answers ``{"duplicate": true}``, but also only once the
   agent's window is durable: otherwise "duplicate" could be acknowledged for a batch whose
   original delivery is lost by a crash a moment later.

If the process dies between 2 and 3, nothing was acknowledged, the window in the database does not
contain the seq, and the agent's retry is applied (once) by the restarted server. If it dies after
3, the retry is refused as a duplicate, because the window is loaded from the database at start.
If the commit fails (database down), the request gets 503 after ``commit_timeout_seconds``; the
batch stays in memory and marked, the committer keeps retrying, and the agent's retry is answered
"duplicate" once the commit finally succeeds. The in-memory window of samples itself is volatile by
design (it is a cache for the policy engine; ``MetricRollup`` keeps history).

Alone, this holds for ONE process per database (the windows live in its memory). With a shared
window (``app.services.series_backend``, several replicas), two more steps make it hold across
replicas: a new batch must also win an atomic claim in Redis (``app.services.redis_dedupe``), and
a commit group is appended to the shared Redis stream after its database commit and before any
of its requests is answered. A delivery another replica claimed is answered "duplicate" only once
the database holds its seq (else 503, retry); a claim whose replica died before committing is
taken over after ``STEAL_CLAIM_AFTER_S``. The policy engine reads the in-process store
(``app.state.series_store``), which the shared backend keeps filled with every replica's samples.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from redis.exceptions import RedisError
from sqlalchemy.engine import Engine

from app.core.config import IngestLimits
from app.goodput.progress import StepTracker, load_step_tracker
from app.metrics import ServerMetrics
from app.models import utcnow
from app.services.errors import Unavailable
from app.services.ingest_dedupe import DedupeWindow
from app.services.ingest_inline import InlineSqliteCommitter
from app.services.ingest_persist import (
    IngestGroup,
    NodeSeen,
    ParticipantSeen,
    load_cursors,
    write_ingest_group,
)
from app.services.ingest_phases import PhaseRetention, PhaseTracker, load_tracker
from app.services.ingest_validation import BatchValidator, IngestRejected, ValidBatch
from app.services.redis_dedupe import NEEDS_RELOAD, RedisDedupe, load_cursor, merge_windows
from app.services.series_backend import (
    LocalSeriesBackend,
    Sample,
    SeriesBackend,
    SharedParticipant,
    participants_of,
)
from app.services.series_store import SeriesStore

log = logging.getLogger("rlguard.ingest")

_RETRY_MIN_S = 0.2
_RETRY_MAX_S = 5.0
# A Redis claim older than this whose seq the database does not hold belongs to a replica that
# died (or answered 503) before committing; another replica may take the batch over.
STEAL_CLAIM_AFTER_S = 30.0


@dataclass(slots=True)
class IngestResult:
    accepted: int
    duplicate: bool


@dataclass(slots=True)
class _AgentState:
    window: DedupeWindow
    version: int = 0  # bumped on every mark
    durable_version: int = 0  # the version the database holds
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)


@dataclass(slots=True)
class ParticipantState:
    job: str
    role: str
    rank: int
    node: str
    phase: str
    step: int
    ts: float


class IngestService:
    """Owns the dedupe windows and the group committer; one per server process."""

    def __init__(
        self,
        *,
        engine: Engine,
        store: SeriesStore,
        limits: IngestLimits,
        metrics: ServerMetrics,
        clock: Callable[[], float] = time.time,
        backend: SeriesBackend | None = None,
        dedupe: RedisDedupe | None = None,
        phase_retention_days: float = 30.0,
        inline: InlineSqliteCommitter | None = None,
    ) -> None:
        self.engine = engine
        # SQLite: commit on the loop when it is safe and fast (app.services.ingest_inline).
        if inline is not None and backend is not None and backend.shared:
            raise ValueError("a shared window publishes every commit to Redis: never inline")
        self.inline = inline
        self.backend: SeriesBackend = backend or LocalSeriesBackend()
        self.dedupe = dedupe
        self._pending_samples: list[Sample] = []
        self._pending_shared: list[SharedParticipant] = []
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.validator = BatchValidator(limits, clock=clock)
        self._agents: dict[tuple[str, str], _AgentState] = {}
        self._pending = IngestGroup()
        self._pending_versions: dict[tuple[str, str], int] = {}
        self._pending_batches = 0
        self._participants: dict[tuple[str, str, int], ParticipantState] = {}
        # Phase changes go into the group commit (app.services.ingest_phases); seeded at start.
        self._phases = PhaseTracker()
        self._steps = StepTracker()  # the goodput ledger's progress (app.goodput.progress)
        self._phase_retention = PhaseRetention(retention_days=phase_retention_days)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        forget_before = utcnow() - timedelta(days=self.limits.cursor_retention_days)
        windows = await asyncio.to_thread(load_cursors, self.engine, forget_before=forget_before)
        self._agents = {k: _AgentState(window=w) for k, w in windows.items()}
        self._phases = await asyncio.to_thread(load_tracker, self.engine)
        self._steps = await asyncio.to_thread(load_step_tracker, self.engine)
        if self.inline is not None:
            await asyncio.to_thread(self.inline.connect)
        if self.dedupe is not None:
            try:
                await self.dedupe.ensure_epoch()
            except RedisError as exc:
                # Start anyway: ingest answers 503 until Redis is back, then the first claim
                # finds no epoch, reloads from the database and sets one.
                log.error("shared window unreachable at start: %s", type(exc).__name__)
        self._task = asyncio.create_task(self._commit_loop(), name="rlguard-ingest-committer")
        self._task.add_done_callback(self._committer_done)
        log.info("ingest started", extra={"agents": len(self._agents)})

    def _committer_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.critical("ingest committer died; ingest answers 503", exc_info=task.exception())

    def committer_alive(self) -> bool:
        """False once the group committer has stopped (readiness reports it)."""
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Flush what is pending (so acknowledged-pending requests complete), then stop."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=self.limits.commit_timeout_seconds)
            except TimeoutError:
                log.error("ingest committer did not flush in time; pending batches not acked")
                self._task.cancel()
            self._task = None
        if self.inline is not None:
            self.inline.close()

    # -- the hot path -----------------------------------------------------------------------

    async def ingest(self, body: bytes, *, token_node: str) -> IngestResult:
        m = self.metrics
        try:
            batch = self.validator.validate(body)
            if batch.node != token_node:
                raise IngestRejected(
                    f"node {batch.node!r} in the body does not match the token's node "
                    f"{token_node!r}",
                    status_code=403,
                    kind="wrong_node",
                )
        except IngestRejected as exc:
            m.ingest_rejections.labels(reason=exc.kind).inc()
            raise
        key = (batch.node, batch.agent_id)
        state = self._agents.get(key)
        if state is None:
            state = self._agents[key] = _AgentState(window=DedupeWindow())
        if self.dedupe is not None and not state.window.seen(batch.seq):
            try:
                claimed = await self._claim_shared(batch, state)
            except RedisError as exc:
                m.ingest_rejections.labels(reason="not_durable").inc()
                raise Unavailable(
                    f"the shared window (Redis) is unreachable ({type(exc).__name__}); nothing "
                    "was applied, retry the same seq"
                ) from None
            if not claimed:
                m.ingest_batches.labels(result="duplicate").inc()
                return IngestResult(accepted=0, duplicate=True)
        if not state.window.mark(batch.seq):
            m.ingest_batches.labels(result="duplicate").inc()
            await self._wait_durable(key, state, state.version)
            return IngestResult(accepted=0, duplicate=True)
        # From here to the end of _queue there is no await: store, window and queue move together.
        stored = self.store.extend(batch.samples)
        if self.backend.shared:
            self._pending_samples.extend(batch.samples)
            self._pending_shared.extend(participants_of(batch.participants, batch.node))
        state.version += 1
        self._queue(batch, state)
        m.ingest_batches.labels(result="accepted").inc()
        m.ingest_samples.inc(stored)
        await self._wait_durable(key, state, state.version)
        return IngestResult(accepted=stored, duplicate=False)

    async def _claim_shared(self, batch: ValidBatch, state: _AgentState) -> bool:
        """True when this replica may apply the batch; False: another replica applied it (and
        the database holds it). Raises Unavailable while that is not yet known."""
        assert self.dedupe is not None
        claimed = await self.dedupe.claim(batch.node, batch.agent_id, batch.seq)
        if claimed == NEEDS_RELOAD:
            # Redis lost its claims: merge what the database holds (every acknowledged batch of
            # every replica) into the local windows, then claim under the new epoch.
            fresh = await asyncio.to_thread(load_cursors, self.engine)
            for k, window in fresh.items():
                known = self._agents.get(k)
                if known is None:
                    self._agents[k] = _AgentState(window=window)
                else:
                    known.window = merge_windows(known.window, window)
            await self.dedupe.ensure_epoch()
            state = self._agents[(batch.node, batch.agent_id)]
            if state.window.seen(batch.seq):
                return False
            claimed = await self.dedupe.claim(batch.node, batch.agent_id, batch.seq)
        if claimed == 1:
            return True
        durable = await asyncio.to_thread(load_cursor, self.engine, batch.node, batch.agent_id)
        if durable is not None and durable.seen(batch.seq):
            return False
        if (
            await self.dedupe.claim(
                batch.node, batch.agent_id, batch.seq, steal_older_than=STEAL_CLAIM_AFTER_S
            )
            == 1
        ):
            log.warning("took over a stale ingest claim", extra={"node": batch.node})
            return True
        raise Unavailable(
            f"batch seq {batch.seq} of agent {batch.agent_id!r} is being applied by another "
            "server replica; retry the same seq"
        )

    def _queue(self, batch: ValidBatch, state: _AgentState) -> None:
        key = (batch.node, batch.agent_id)
        pending = self._pending
        pending.cursors[key] = (state.window.high_seq, state.window.window_mask)
        self._pending_versions[key] = state.version
        self._pending_batches += 1
        seen = utcnow()
        node = pending.nodes.get(batch.node)
        if node is None:
            pending.nodes[batch.node] = NodeSeen(batch.agent_id, seen, batch.fingerprint)
        else:
            node.agent_id, node.seen_at = batch.agent_id, seen
            if batch.fingerprint is not None:
                node.fingerprint = batch.fingerprint
        phases = self._phases
        for p in batch.participants:
            pending.jobs[p.job] = seen
            change = phases.observe(p.job, p.role, p.rank, batch.node, p.phase, p.step, p.ts)
            if change is not None:
                pending.phases.append(change)
            moved = self._steps.observe(p.job, p.role, p.rank, p.step, p.ts)
            if moved is not None:
                pending.steps.append(moved)
            pkey = (p.job, p.role, p.rank)
            known = pending.participants.get(pkey)
            if known is None or known.ts <= p.ts:
                pending.participants[pkey] = ParticipantSeen(batch.node, p.phase, p.step, p.ts)
            mem = self._participants.get(pkey)
            if mem is None or mem.ts <= p.ts:
                self._participants[pkey] = ParticipantState(
                    p.job, p.role, p.rank, batch.node, p.phase, p.step, p.ts
                )
        self._wake.set()

    async def _wait_durable(self, key: tuple[str, str], state: _AgentState, version: int) -> None:
        if state.durable_version >= version:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append((version, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=self.limits.commit_timeout_seconds)
        except TimeoutError:
            self.metrics.ingest_rejections.labels(reason="not_durable").inc()
            raise Unavailable(
                "the batch is applied in memory but could not be committed to the database "
                f"within {self.limits.commit_timeout_seconds:g} s; retry the same seq"
            ) from None

    # -- the group committer ------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        backoff = _RETRY_MIN_S
        while True:
            if not self._pending:
                if self._stopping:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            group, versions = self._pending, self._pending_versions
            batches, self._pending_batches = self._pending_batches, 0
            self._pending, self._pending_versions = IngestGroup(), {}
            samples, shared = self._pending_samples, self._pending_shared
            self._pending_samples, self._pending_shared = [], []
            started = time.perf_counter()
            try:
                if self.inline is not None and self.inline.try_commit(group, self._phase_retention):
                    self.metrics.ingest_commits.labels(path="inline").inc()
                else:
                    await asyncio.to_thread(self._commit, group, samples, shared)
                    self.metrics.ingest_commits.labels(path="thread").inc()
            except Exception:
                # Keep the group (newer state wins) and retry; waiters time out with 503.
                log.exception("ingest commit failed; retrying in %.1f s", backoff)
                self.metrics.ingest_commit_failures.inc()
                self._pending.absorb_older(group)
                self._pending_samples[:0] = samples
                self._pending_shared[:0] = shared
                for k, v in versions.items():
                    self._pending_versions.setdefault(k, v)
                self._pending_batches += batches
                if self._stopping and backoff >= _RETRY_MAX_S:
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RETRY_MAX_S)
                continue
            backoff = _RETRY_MIN_S
            self.metrics.ingest_commit_seconds.observe(time.perf_counter() - started)
            self.metrics.ingest_commit_group_size.observe(batches)
            for k, version in versions.items():
                state = self._agents[k]
                if version > state.durable_version:
                    state.durable_version = version
                still = []
                for want, fut in state.waiters:
                    if want <= state.durable_version:
                        if not fut.done():
                            fut.set_result(None)
                    else:
                        still.append((want, fut))
                state.waiters = still

    def _commit(
        self, group: IngestGroup, samples: list[Sample], shared: list[SharedParticipant]
    ) -> None:
        write_ingest_group(self.engine, group, phase_retention=self._phase_retention)
        # After the database: a retry after a failed publish rewrites the same (idempotent)
        # upserts, and never appends the samples to the shared stream twice.
        self.backend.publish(samples, shared)

    # -- read side ----------------------------------------------------------------------------

    def participants(self) -> list[ParticipantState]:
        """Latest reported state of every participant (of every replica with a shared window)."""
        merged = dict(self._participants)
        for p in self.backend.participants():
            key = (p.job, p.role, p.rank)
            mine = merged.get(key)
            if mine is None or mine.ts < p.ts:
                merged[key] = ParticipantState(p.job, p.role, p.rank, p.node, p.phase, p.step, p.ts)
        return list(merged.values())

    def agents(self) -> int:
        return len(self._agents)
