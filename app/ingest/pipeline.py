"""Ingest: validate a batch, apply it to the series store once, acknowledge it once it is durable.

* A request is validated (``ingest_validation``), then checked against its agent's dedupe window
  and marked (``ingest_dedupe``) with no ``await`` in between: two deliveries of one (node,
  agent, seq) never both pass.
* A new batch enters the in-memory ``SeriesStore`` at once; its durable effects and the agent's
  new window go to the group committer, which writes all that is queued in one transaction. Only
  then is ``{"accepted": N, "duplicate": false}`` sent, and a duplicate is answered only once
  the window is durable: nothing acknowledged is lost, and a duplicate stays refused after a
  restart.
* A group that fails because of its data is bisected (``ingest_committer``): a batch the database
  refuses gets 422 and its seq back. A commit that fails otherwise (database down) answers 503
  after ``commit_timeout_seconds`` and is retried; the agent's retry is then a "duplicate".
* With a shared window (``app.series.backend``) a new batch must also win a claim in Redis
  (``app.ingest.redis_dedupe``), and a group joins the shared stream before any answer.

What a crash at each step does, and the claims across replicas: ``docs/api.md`` (ingest).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from redis.exceptions import RedisError
from sqlalchemy.engine import Engine

from app.core.config import IngestLimits, NodeQuotaSettings
from app.core.errors import Unavailable
from app.core.server_metrics import ServerMetrics
from app.core.write_turns import WriteTurns
from app.ingest.agent_state import AgentState as _AgentState
from app.ingest.agent_state import resolve_requests
from app.ingest.certain import CertainFaultWatch
from app.ingest.clock_skew import ClockOffsets, offset_sample
from app.ingest.commit import Committer
from app.ingest.commit.groups import (
    QueuedBatch,
    Rejection,
    group_of,
    is_transient,
    isolate,
)
from app.ingest.commit.thread import ThreadCommitter
from app.ingest.dedupe import DedupeWindow
from app.ingest.participant_table import ParticipantTable
from app.ingest.persist import load_cursors
from app.ingest.phases import PhaseRetention, PhaseTracker, load_tracker
from app.ingest.quotas import NodeQuotas, QuotaExceeded
from app.ingest.redis_dedupe import NEEDS_RELOAD, RedisDedupe, load_cursor, merge_windows
from app.ingest.step_progress import StepTracker, load_step_tracker
from app.ingest.storage_full import StorageFullCircuit
from app.ingest.validation import BatchValidator, IngestRejected, ValidBatch
from app.models import utcnow
from app.series.backend import (
    LocalSeriesBackend,
    ParticipantHeartbeat,
    SeriesBackend,
    participants_of,
)
from app.series.store import SeriesStore

log = logging.getLogger("rlguard.ingest")

_RETRY_MIN_S = 0.2
_RETRY_MAX_S = 5.0
# A Redis claim older than this whose seq the database does not hold belongs to a replica that
# died (or answered 503) before committing; another replica may take the batch over.
STEAL_CLAIM_AFTER_S = 30.0
# A node's participants the policy's table keeps, in multiples of its process quota
# (node_quotas.max_participants, counted over a window): those of jobs long finished go first.
PARTICIPANTS_KEPT_PER_QUOTA = 4


@dataclass(slots=True)
class IngestResult:
    accepted: int
    duplicate: bool


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
        committer: Committer | None = None,
        quotas: NodeQuotas | None = None,
    ) -> None:
        self.engine = engine
        self.backend: SeriesBackend = backend or LocalSeriesBackend()
        # How a group reaches the database (app.ingest.commit): on a worker thread unless the
        # server chose a path on the event loop (main.py, choose_committer).
        self.committer: Committer = committer or ThreadCommitter(engine, self.backend)
        if self.backend.shared and not isinstance(self.committer, ThreadCommitter):
            raise ValueError("a shared window publishes every commit to Redis: on the thread")
        self.dedupe = dedupe
        self.store = store
        self.limits = limits
        self.metrics = metrics
        self.validator = BatchValidator(limits, clock=clock)
        # What one node may create (app.ingest.quotas); series leave it as the store drops them.
        self.quotas = quotas or NodeQuotas(
            NodeQuotaSettings(), refusals=metrics.ingest_quota_refusals
        )
        store.on_forget(self.quotas.forget_series)
        self.validator.gate = self.quotas  # refuses a batch's excess new series early
        self._clock = clock
        self._clock_offsets = ClockOffsets(limits.clock_correct_above_seconds)
        self._agents: dict[tuple[str, str], _AgentState] = {}
        self._queued: list[QueuedBatch] = []  # accepted, not yet committed, in arrival order
        self._done: dict[int, asyncio.Future[None]] = {}  # id(queued batch) -> its request's
        self._failing_since: float | None = None  # monotonic time of the first failed retry
        # A full disk: named in the 503, and answered at once while it lasts.
        self._storage_full = StorageFullCircuit(limits.storage_full_hold_seconds)
        # What the policy reads every tick; per node at most PARTICIPANTS_KEPT_PER_QUOTA x its
        # process quota (app.ingest.participant_table).
        self._participants = ParticipantTable(
            PARTICIPANTS_KEPT_PER_QUOTA * self.quotas.settings.max_participants
        )
        # Phase changes go into the group commit (app.ingest.phases); seeded at start.
        self._phases = PhaseTracker()
        self._steps = StepTracker()  # the goodput ledger's progress (app.ingest.step_progress)
        self._phase_retention = PhaseRetention(retention_days=phase_retention_days)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._certain: CertainFaultWatch | None = None

    def watch_certain_faults(self, watch: CertainFaultWatch | None) -> None:
        """Tell ``watch`` about every committed batch that carries a certain fault (the policy
        scheduler's event path, registered by ``app.scheduler``); None stops it."""
        self._certain = watch
        # Another replica's certain fault, once this replica's store has it (shared window).
        self.backend.on_certain(watch.durable if watch is not None else None)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        forget_before = utcnow() - timedelta(days=self.limits.cursor_retention_days)
        windows = await asyncio.to_thread(load_cursors, self.engine, forget_before=forget_before)
        self._agents = {k: _AgentState(window=w) for k, w in windows.items()}
        self._phases = await asyncio.to_thread(load_tracker, self.engine)
        self._steps = await asyncio.to_thread(load_step_tracker, self.engine)
        await self.committer.start()
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

    def commits_failing_for(self) -> float | None:
        """Seconds since group commits started failing (None while they succeed); readiness
        reports it: acknowledged ingest is stalled while it is not None."""
        if self._failing_since is None:
            return None
        return time.monotonic() - self._failing_since

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
        await self.committer.stop()

    # -- the hot path -----------------------------------------------------------------------

    def admit_request(self, node: str) -> None:
        """Before a request of ``node`` is read: 429 while its batches owe CPU time, so a node
        flooding the loop pays for it, not the other nodes (``app.ingest.cpu_share``)."""
        try:
            self.quotas.admit_request(node)
        except QuotaExceeded:
            self.metrics.ingest_rejections.labels(reason="quota").inc()
            raise

    async def ingest(
        self,
        body: bytes,
        *,
        token_node: str,
        authorize: Callable[[ValidBatch], None] | None = None,
    ) -> IngestResult:
        """``authorize``: the token's own check of the batch (its job scope), raising
        IngestRejected; asked before anything of the batch is applied."""
        m = self.metrics
        received = self._clock()  # before the parse: its time is not the agent clock's fault
        cpu = time.thread_time()  # the loop's CPU the batch takes, charged to the token's node
        refused = True
        try:
            slices = self.validator.validate_in_slices(body, token_node=token_node)
            while True:
                try:
                    next(slices)
                except StopIteration as done:
                    batch = done.value
                    break
                # Between two slices of a batch's new series: other requests run meanwhile.
                self.quotas.charge_cpu(token_node, time.thread_time() - cpu)
                await asyncio.sleep(0)
                cpu = time.thread_time()
            if batch.node != token_node:
                raise IngestRejected(
                    f"node {batch.node!r} in the body does not match the token's node "
                    f"{token_node!r}",
                    status_code=403,
                    kind="wrong_node",
                )
            if authorize is not None:
                authorize(batch)
            refused = False
        except IngestRejected as exc:
            m.ingest_rejections.labels(reason=exc.kind).inc()
            raise
        finally:
            self.quotas.charge_cpu(token_node, time.thread_time() - cpu, refused=refused)
        return await self.apply(batch, received_at=received)

    async def apply(self, batch: ValidBatch, *, received_at: float | None = None) -> IngestResult:
        """Apply a validated batch once and answer when it is durable (``ingest`` after its
        checks; tests drive the committer with batches validation would refuse).
        ``received_at``: when its request arrived (default now), for the clock offset."""
        m = self.metrics
        refusal = self._storage_full.refusal()
        if refusal is not None:  # before anything of the batch is applied or claimed
            m.ingest_rejections.labels(reason="storage_full").inc()
            raise refusal
        key = (batch.node, batch.agent_id)
        state = self._agents.get(key)
        if state is None:
            state = self._agents[key] = _AgentState(window=DedupeWindow())
        cpu = time.thread_time()  # admitting and storing the batch: charged to its node
        if not state.window.seen(batch.seq):
            # Before the seq is marked (and claimed): a batch over a node's quota is refused
            # with nothing of it kept, and its corrected resend under the same seq is applied.
            try:
                self.quotas.admit(batch)
            except QuotaExceeded:
                m.ingest_rejections.labels(reason="quota").inc()
                self.quotas.charge_cpu(batch.node, time.thread_time() - cpu, refused=True)
                raise
        if self.dedupe is not None and not state.window.seen(batch.seq):
            self.quotas.charge_cpu(batch.node, time.thread_time() - cpu)
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
            cpu = time.thread_time()  # the claim's await ran other requests meanwhile
        if not state.window.mark(batch.seq):
            m.ingest_batches.labels(result="duplicate").inc()
            await self._wait_durable(state, state.version)
            refused = state.rejected.get(batch.seq)
            if refused is not None:  # the original was refused at commit while this waited
                raise IngestRejected(refused, kind="uncommittable")
            return IngestResult(accepted=0, duplicate=True)
        # From here to the end of _queue there is no await: store, window and queue move together.
        received = self._clock() if received_at is None else received_at
        batch, offset = self._clock_offsets.correct(batch, received)
        stored = self.store.extend(batch.samples)
        if offset is not None:  # not counted as accepted: the agent did not send it
            skew = offset_sample(batch.node, offset, received)
            self.store.extend([skew])
            batch.samples.append(skew)  # published with the batch's samples (shared window)
        state.version += 1
        done = self._queue(batch, state)
        m.ingest_batches.labels(result="accepted").inc()
        m.ingest_samples.inc(stored)
        self.quotas.charge_cpu(batch.node, time.thread_time() - cpu)
        await self._wait_committed(done)
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

    def _queue(self, batch: ValidBatch, state: _AgentState) -> asyncio.Future[None]:
        """Queue the batch's durable effects; the future resolves once they are committed."""
        seen = utcnow()
        phases, steps = [], []
        for p in batch.participants:
            change = self._phases.observe(p.job, p.role, p.rank, batch.node, p.phase, p.step, p.ts)
            if change is not None:
                phases.append(change)
            moved = self._steps.observe(p.job, p.role, p.rank, p.step, p.ts, phase=p.phase)
            if moved is not None:
                steps.append(moved)
        self._participants.report(batch.node, batch.participants)
        queued = QueuedBatch(
            batch.node,
            batch.agent_id,
            batch.seq,
            state.version,
            seen,
            batch.fingerprint,
            batch.participants,
            phases,
            steps,
        )
        if self.backend.shared:
            queued.samples = batch.samples
            queued.shared = participants_of(batch.participants, batch.node)
        if self._certain is not None:
            queued.certain = self._certain.seen_in(phases, batch.samples)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # A request that gave up (503) leaves its future unawaited: retrieve its outcome here so
        # asyncio does not log "exception was never retrieved".
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._done[id(queued)] = done
        self._queued.append(queued)
        self._wake.set()
        return done

    async def _wait_committed(self, done: asyncio.Future[None]) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=self.limits.commit_timeout_seconds)
        except TimeoutError:
            raise self._not_durable() from None

    async def _wait_durable(self, state: _AgentState, version: int) -> None:
        if state.durable_version >= version:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append((version, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=self.limits.commit_timeout_seconds)
        except TimeoutError:
            raise self._not_durable() from None

    def _not_durable(self) -> Unavailable:
        self.metrics.ingest_rejections.labels(reason="not_durable").inc()
        return Unavailable(
            "the batch is applied in memory but could not be committed to the database "
            f"within {self.limits.commit_timeout_seconds:g} s; retry the same seq"
        )

    # -- the group committer ------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        backoff = _RETRY_MIN_S
        while True:
            if not self._queued:
                if self._stopping:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            batches, self._queued = self._queued, []
            started = time.perf_counter()
            failure = await self._commit_or_isolate(batches)
            if failure is None:
                backoff = _RETRY_MIN_S
                self._failing_since = None
                self._storage_full.commit_succeeded()
                self.metrics.ingest_commit_seconds.observe(time.perf_counter() - started)
                self.metrics.ingest_commit_group_size.observe(len(batches))
                continue
            # The database (or Redis) is failing: what is left stays queued, ahead of newer
            # batches, and is retried whole; its waiters time out with 503.
            log.error(
                "ingest commit failed (%s); retrying in %.1f s",
                type(failure).__name__,
                backoff,
                exc_info=failure,
            )
            if self._failing_since is None:
                self._failing_since = time.monotonic()
            if self._storage_full.commit_failed(failure):
                self._answer_waiting_storage_full()
            if self._stopping and backoff >= _RETRY_MAX_S:
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _RETRY_MAX_S)

    async def _commit_or_isolate(self, batches: list[QueuedBatch]) -> BaseException | None:
        """Commit ``batches`` in one transaction; when their data fails it, commit all but the
        batch(es) at fault. Returns the transient failure that left batches queued, or None."""
        group = group_of(batches)
        try:
            path = await self.committer.commit(group, batches, self._phase_retention)
            self.metrics.ingest_commits.labels(path=path).inc()
        except Exception as exc:
            self.metrics.ingest_commit_failures.inc()
            if is_transient(exc):
                self._queued[:0] = batches
                return exc
            log.error(
                "ingest group of %d batches refused by the database (%s); isolating the "
                "batch(es) at fault",
                len(batches),
                type(exc).__name__,
            )
            outcome = await asyncio.to_thread(isolate, batches, self._commit_batches)
            self._resolve(outcome.committed, outcome.rejected)
            if outcome.unresolved:
                self._queued[:0] = outcome.unresolved
                return outcome.transient
            return None
        self._resolve(batches, [])
        return None

    def _answer_waiting_storage_full(self) -> None:
        """Answer every request waiting for a commit now, naming the full disk, instead of at
        its timeout; the batches stay queued and commit once there is space."""
        waiting = [*self._done.values()]
        for state in self._agents.values():
            waiting.extend(fut for _, fut in state.waiters)
        answered = 0
        for fut in waiting:
            if not fut.done():
                fut.set_exception(self._storage_full.waiting_answer())
                fut.exception()  # retrieved: the request may have given up on it already
                answered += 1
        self.metrics.ingest_rejections.labels(reason="storage_full").inc(answered)

    def _commit_batches(self, batches: Sequence[QueuedBatch]) -> None:
        self.committer.commit_on_this_thread(batches, self._phase_retention)

    def _resolve(self, committed: list[QueuedBatch], rejected: list[Rejection]) -> None:
        resolve_requests(
            self._agents,
            self._done,
            committed,
            rejected,
            metrics=self.metrics,
            certain=self._certain,
        )

    # -- read side ----------------------------------------------------------------------------

    def participants(self) -> list[ParticipantHeartbeat]:
        """Latest reported state of every participant (of every replica with a shared window)."""
        merged = self._participants.snapshot()
        for p in self.backend.participants():
            key = (p.job, p.role, p.rank)
            mine = merged.get(key)
            if mine is None or mine.ts < p.ts:
                merged[key] = p
        return list(merged.values())

    def agents(self) -> int:
        return len(self._agents)

    @property
    def write_turns(self) -> WriteTurns | None:
        """SQLite's turns between ingest commits and the background writers (the tick, the
        rollup pass): app.core.write_turns; None on PostgreSQL."""
        return self.committer.write_turns
