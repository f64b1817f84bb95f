"""The server's scheduled work: the policy tick, outbox dispatch, approval expiry, rollups,
alert reminders, retention.

Only one server replica runs it: each tick renews a lease row in the database (the
``scheduler_lease`` table; a conditional UPDATE is atomic on SQLite and PostgreSQL). A replica
that is not the holder skips every job until the lease expires.

The tick builds the engine's :class:`World` from the in-process series store, the ingest
service's participant table and the node table, runs :class:`PolicyEngine`, writes its
decisions in short transactions that ingest's commits may go between
(``app.incidents.tick_writes``) and then wakes the dispatcher, so that an action or an alert
delivery reaches the broker right after its outbox row committed.

Event path (docs/architecture.md, "One sample", step 4): once ingest has committed a batch that
carries a fault needing no window (``app.ingest.certain``), it calls :meth:`PolicyScheduler.nudge`
and the event thread runs the tick itself at once, on the lease holder, under the tick's lock:
the same decision path and keys, so the early tick and the interval tick never both plan a fault.

The per-minute rollups (``app.series.rollups``) are one of these jobs: only the holder writes
them, fenced by the lease's holder and fencing token (``lease_fence``), and a replica that
takes the lease over first reads what the previous holder wrote (``RollupWriter.take_over``) so
that no minute is rolled twice. The rollup job of a replica that is not the holder only forgets
series gone silent (memory), and the holder runs a last pass when it stops, before it lets the
lease go.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, col, select

from app.actions.outbox import OutboxDispatcher
from app.alerts.queue import took_queued_rows
from app.alerts.service import run_alert_maintenance
from app.core.db import table_of
from app.core.gc_tuning import FreezeOnGrowth
from app.core.wakeup import WakeThread
from app.core.write_turns import WriteTurns
from app.incidents.approvals import expire_approvals
from app.incidents.mute_ended import resume_unmuted
from app.incidents.queries import (
    open_incident_failures,
    open_incidents_for_engine,
    open_incidents_whose_plan_succeeded,
)
from app.incidents.tick_writes import write_decisions
from app.ingest.certain import CertainFaultWatch
from app.models._types import utcnow
from app.models.action import SchedulerLease
from app.models.cluster import Node
from app.models.incident import Incident, IncidentStatus
from app.policy import metric_names as m
from app.policy.clock import Clock, WallClock
from app.policy.detectors import ExternalAlertDetector, ExternalAlerts, default_detectors
from app.policy.engine import PolicyEngine, TickResult
from app.policy.policy_file import Policy, default_policy
from app.policy.world import ParticipantSource, World, participants_from_ingest
from app.series.rollups import LeaseLost, RollupWriter
from app.series.store import SeriesStore
from app.silences.windows import maintenance_at

log = logging.getLogger("rlguard.scheduler")

LEASE_NAME = "policy-scheduler"

# 0/1 gauges whose rise to 1 is a fault with no window to wait for (the event path), an engine's
# process gone among them; exits and Ray deaths come as participant phases (the policy's
# ``detection.heartbeat.exited_phases``).
CERTAIN_FAULT_GAUGES = (m.GPU_LOST, m.ROLLOUT_ENGINE_PROCESS_DEAD)


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


class PolicyScheduler:
    def __init__(
        self,
        *,
        engine: Engine,
        store: SeriesStore,
        participants: ParticipantSource,
        dispatcher: OutboxDispatcher | None,
        policy: Policy | None = None,
        clock: Clock | None = None,
        lease_seconds: float = 10.0,
        dispatch_interval: float = 2.0,
        retention_days: float = 90.0,
        holder: str | None = None,
        rollups: RollupWriter | None = None,
        dry_run: bool = False,
        write_turns: WriteTurns | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.participants = participants
        self.dispatcher = dispatcher
        self.policy = policy or default_policy()
        self.clock = clock or WallClock()
        self.lease_seconds = lease_seconds
        self.dispatch_interval = dispatch_interval
        self.retention_days = retention_days
        self.rollups = rollups
        self.dry_run = dry_run  # Settings.automation.dry_run: plans are shown, never run
        self.write_turns = write_turns  # SQLite: ingest's commits go between the tick's writes
        self._rollup_token: int | None = None  # the lease's token when the writer took over
        self._warned_unrolled = False
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.external = ExternalAlerts()
        self.policy_engine = PolicyEngine(
            self.policy,
            detectors=[
                *default_detectors(self.policy),
                ExternalAlertDetector(self.policy, self.external),
            ],
        )
        self._leader_until = 0.0
        self._renew_after = 0.0
        self._needs_restore = True
        self._lock = threading.Lock()
        self._heap = FreezeOnGrowth()  # the series store out of the collector's full passes
        self._scheduler: BackgroundScheduler | None = None
        # The event path (``nudge``): a thread of its own, so an early tick never waits for a
        # free slot in the interval jobs' pool.
        self._event_path = WakeThread(self._event_tick, name="rlguard-policy-event")
        self.event_ticks = 0  # early ticks run for a certain fault (tests and logs read it)
        self._dispatch_again = threading.Event()
        self.last_tick: TickResult | None = None
        self.last_tick_seconds = 0.0

    # -- lease ----------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return time.monotonic() < self._leader_until

    def _renew(self) -> bool:
        """Take or renew the lease, writing it only once a third of it has passed.

        Renewing on every tick made each tick an fsync'd write that queued for SQLite's one
        write lock behind ingest commits: most of a tick's time, and what made it overrun its
        interval on a busy disk. The holder still renews well before the lease can expire
        (and stops acting as the holder at 80 % of it, see ``is_leader``).
        """
        started = time.monotonic()
        if self.is_leader() and started < self._renew_after:
            return True
        try:
            ok = try_lease(self.engine, holder=self.holder, ttl=self.lease_seconds)
        except SQLAlchemyError as exc:
            log.warning("scheduler lease not renewed: %s", exc)
            ok = False
        if ok:
            if not self.is_leader():
                log.info("scheduler lease taken by %s", self.holder)
                self._needs_restore = True
            self._leader_until = started + self.lease_seconds * 0.8
            self._renew_after = started + self.lease_seconds / 3
        else:
            self._leader_until = 0.0
        return ok

    # -- the tick -------------------------------------------------------------------------

    def world(self, now: float) -> World:
        with Session(self.engine) as session:
            nodes = session.exec(select(Node.name, Node.last_seen_at, Node.fingerprint)).all()
            maintenance = maintenance_at(session, datetime.fromtimestamp(now, UTC))
        seen = {n: at.timestamp() for n, at, _ in nodes if at is not None}
        prints = {n: {str(k): str(v) for k, v in fp.items()} for n, _, fp in nodes if fp}
        return World(
            now=now,
            store=self.store,
            participants=self.participants(),
            node_last_seen=seen,
            fingerprints=prints,
            maintenance=maintenance,
        )

    def tick(self) -> TickResult | None:
        """One policy tick (no-op unless this replica holds the lease)."""
        with self._lock:
            if not self._renew():
                return None
            started = time.perf_counter()
            try:
                with Session(self.engine) as session:
                    if self._needs_restore:
                        self._forget_closed_before_resync(session)
                        self.policy_engine = _fresh_engine_keeping_detectors(
                            self.policy_engine, self.policy
                        )
                        self.policy_engine.restore(open_incidents_for_engine(session))
                        self._needs_restore = False
                    self._sync_engine(session)
                result = self.policy_engine.tick(self.world(self.clock.now()))
                self._heap.after_tick(len(self.store))
                if result.decisions:
                    # In short transactions, ingest going between them (tick_writes.py).
                    written = write_decisions(
                        self.engine,
                        result.decisions,
                        policy=self.policy,
                        dry_run=self.dry_run,
                        turns=self.write_turns,
                    )
                    for key in written.persisted.resolved_keys:
                        self.policy_engine.forget(key)
                    if written.new_rows:  # actions or alert deliveries wait in the outbox
                        self.wake_dispatcher()
            except SQLAlchemyError:
                log.exception("policy tick could not use the database; will resync from it")
                self._needs_restore = True
                return None
            finally:
                self.last_tick_seconds = time.perf_counter() - started
            self.last_tick = result
            return result

    def _forget_closed_before_resync(self, session: Session) -> None:
        """Incidents the engine holds open whose very occurrence the database has closed since
        (an approved plan completed) are forgotten first, so the fresh engine remembers that
        occurrence. One the engine opened but could not write stays unknown to the database and
        is opened again; an older closed incident of the same key has another ``since``."""
        open_keys = set(open_incident_failures(session))
        for key, inc in self.policy_engine.open_incidents.items():
            if key in open_keys:
                continue
            closed = session.exec(
                select(Incident)
                .where(Incident.key == key, Incident.status == IncidentStatus.resolved.value)
                .order_by(col(Incident.id).desc())
            ).first()
            if closed is not None and (closed.evidence or {}).get("since") == inc.last_since:
                self.policy_engine.forget(key)

    def _sync_engine(self, session: Session) -> None:
        """Fold in what happened outside the engine: failed recoveries, plans that succeeded,
        incidents closed."""
        failures = open_incident_failures(session)
        for key in list(self.policy_engine.open_incidents):
            if key not in failures:
                self.policy_engine.forget(key)
        for key, n in failures.items():
            self.policy_engine.set_recovery_failures(key, n)
        succeeded = open_incidents_whose_plan_succeeded(session)
        for key in failures:
            self.policy_engine.set_plan_succeeded(key, key in succeeded)

    # -- the event path -------------------------------------------------------------------

    def nudge(self) -> None:
        """A batch carrying a certain fault is durable: tick now, not at the next interval.
        Called by ingest on its event loop: it must not block, so it only wakes the event
        thread (a nudge during an early tick is one more tick after it, never a lost one)."""
        self._event_path.wake()

    def _event_tick(self) -> None:
        if not self.is_leader():
            return  # only the lease holder decides; another replica's tick will see it
        self._safe(self.tick)()
        self.event_ticks += 1

    # -- other jobs -------------------------------------------------------------------------

    def dispatch(self) -> None:
        if self.dispatcher is None or not self.is_leader():
            return
        # A wake-up during a pass (APScheduler skips the woken run: one instance at a time) is
        # one more pass right after it, not a row left for the next interval (2 s).
        while True:
            self._dispatch_again.clear()
            try:
                self.dispatcher.dispatch_due()
            except SQLAlchemyError as exc:
                log.warning("outbox dispatch skipped: %s", exc)
                return
            if not self._dispatch_again.is_set():
                return

    def wake_dispatcher(self) -> None:
        self._dispatch_again.set()
        sched = self._scheduler
        if sched is not None and sched.running:
            job = sched.get_job("dispatch")
            if job is not None:
                job.modify(next_run_time=datetime.now(UTC))
                return
        self.dispatch()

    def alert_maintenance(self) -> None:
        if self.is_leader() and run_alert_maintenance(self.engine):
            self.wake_dispatcher()

    def expire(self) -> None:
        if not self.is_leader():
            return
        with Session(self.engine) as session:
            n = expire_approvals(session)
            session.commit()
        if n:
            log.info("%d approval(s) expired", n)

    def resume_unmuted(self) -> None:
        """Alert and plan what an ended silence, window or node incident held back
        (``app.incidents.mute_ended``). Under the tick's lock: a tick planning the same
        incident's escalation at the same moment would otherwise race it."""
        if not self.is_leader():
            return
        with self._lock, Session(self.engine, expire_on_commit=False) as session:
            out = resume_unmuted(session, policy=self.policy, dry_run=self.dry_run, now=utcnow())
            session.commit()
            new_rows = bool(out.new_actions) or took_queued_rows(session)
        if new_rows:
            self.wake_dispatcher()

    def retention(self) -> None:
        if not self.is_leader():
            return
        cutoff = utcnow() - timedelta(days=self.retention_days)
        with Session(self.engine) as session:
            old = session.exec(
                select(Incident).where(
                    Incident.status == IncidentStatus.resolved.value,
                    col(Incident.resolved_at) < cutoff,
                )
            ).all()
            for inc in old:
                session.delete(inc)
            session.commit()
        if old:
            log.info("retention removed %d resolved incident(s)", len(old))

    def rollup(self) -> int:
        """One rollup pass if this replica holds the lease; returns the rows written."""
        writer = self.rollups
        if writer is None:
            return 0
        token = lease_token(self.engine, holder=self.holder) if self.is_leader() else None
        if token is None:
            writer.forget_silent_series()
            self._warn_unrolled(writer)
            return 0
        if token != self._rollup_token:
            writer.take_over()
            self._rollup_token = token
        try:
            return writer.run_once(fence=lease_fence(holder=self.holder, token=token))
        except LeaseLost:
            self._rollup_token = None  # take over again (re-read the rows) if it comes back
            log.info("scheduler lease lost during a rollup pass; the new holder rolls up")
            return 0
        except Exception:
            writer.metrics.rollup_failures.inc()
            raise

    def _warn_unrolled(self, writer: RollupWriter) -> None:
        if writer.shared or self._warned_unrolled or not len(self.store):
            return
        self._warned_unrolled = True
        log.warning(
            "this replica does not hold the scheduler lease and its series window is not "
            "shared: the samples it ingests are rolled up only if it takes the lease while they "
            "are in its window; run one server per database or set "
            "RLGUARD_SERIES__SHARED_WINDOW=true"
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, tick_now: bool = True) -> None:
        """Run the jobs; the first tick at once, or one interval from now (``tick_now=False``,
        when the caller has just run one)."""
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 5},
            timezone=UTC,
        )
        sched.add_job(
            self._safe(self.tick),
            "interval",
            seconds=self.policy.tick_seconds,
            id="tick",
            next_run_time=datetime.now(UTC)
            + timedelta(seconds=0 if tick_now else self.policy.tick_seconds),
        )
        sched.add_job(
            self._safe(self.dispatch), "interval", seconds=self.dispatch_interval, id="dispatch"
        )
        sched.add_job(self._safe(self.expire), "interval", seconds=10, id="expire")
        sched.add_job(self._safe(self.resume_unmuted), "interval", seconds=5, id="unmuted")
        sched.add_job(self._safe(self.retention), "interval", hours=6, id="retention")
        if self.rollups is not None:
            sched.add_job(
                self._safe(self.rollup),
                "interval",
                seconds=self.rollups.settings.rollup_interval_seconds,
                id="rollups",
            )
            self.rollups.scheduled_by = self.holder
        # Alerts: purge old deliveries, queue repeat reminders (the dispatcher sends them).
        sched.add_job(self._safe(self.alert_maintenance), "interval", seconds=5, id="alerts")
        sched.start()
        self._scheduler = sched
        self._event_path.start()
        log.info("policy scheduler started", extra={"holder": self.holder})

    def stop(self) -> None:
        self._event_path.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        if self.rollups is not None:
            # The last complete minutes, written while this replica still holds the lease.
            self._safe(self.rollup)()
            if self.rollups.scheduled_by == self.holder:
                self.rollups.scheduled_by = None
        self._rollup_token = None
        try:
            release_lease(self.engine, holder=self.holder)
        except SQLAlchemyError as exc:
            log.warning("scheduler lease not released: %s", exc)

    @staticmethod
    def _safe(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception:  # a scheduled job must never kill the scheduler; log it loudly
                log.exception("scheduled job %s failed", getattr(fn, "__name__", fn))

        # APScheduler names a job by its function's qualified name in its warnings ("skipped:
        # maximum number of running instances"): "tick", not "PolicyScheduler._safe.<locals>.run".
        run.__name__ = run.__qualname__ = getattr(fn, "__name__", "job")
        return run


def _fresh_engine_keeping_detectors(old: PolicyEngine, policy: Policy) -> PolicyEngine:
    # Detector memory (phase clocks, counter baselines) survives a resync; incident memory is
    # rebuilt from the database, the truth after a failed write or a lease change. So does the
    # memory of occurrences whose incidents were closed (only ever from closures the database
    # holds): the detectors still report such an occurrence, and a fresh engine without it would
    # open a second incident for it. So do the nodes just back from a silence and the open budget.
    return PolicyEngine(
        policy,
        detectors=old.detectors,
        closed_occurrences=old.closed_occurrences,
        node_returns=old.node_returns,
        open_budget=old.open_budget,
    )


# -- wiring into the server -------------------------------------------------------------------


@asynccontextmanager
async def policy_lifespan(app: Any) -> AsyncIterator[None]:
    """Run the policy scheduler inside the server (listed in ``app.runtime.SERVER_LIFESPANS``),
    on the policy the app loaded (``app.state.policy``, the one the dashboard draws)."""
    settings = app.state.settings
    rs = settings.recovery
    if not settings.policy_scheduler:
        log.info("policy scheduler disabled (RLGUARD_POLICY_SCHEDULER=0)")
        yield
        return
    from app.tasks.celery_app import make_celery

    policy = app.state.policy
    dispatcher = OutboxDispatcher(
        engine=app.state.engine,
        celery_app=make_celery(settings),
        redispatch_after=rs.redispatch_after_seconds,
    )
    sched = PolicyScheduler(
        engine=app.state.engine,
        store=app.state.series_store,
        participants=participants_from_ingest(app.state.ingest),
        dispatcher=dispatcher,
        policy=policy,
        lease_seconds=rs.lease_seconds,
        dispatch_interval=rs.dispatch_interval_seconds,
        retention_days=rs.retention_days,
        rollups=getattr(app.state, "rollups", None),
        dry_run=settings.automation.dry_run,
        write_turns=app.state.ingest.write_turns,
    )
    sched.policy_engine.limit_opens_per_node(settings.node_quotas.incidents_per_minute)
    app.state.policy_scheduler = sched
    # The first tick is slow (the lease row written and fsync'd, the open incidents read, every
    # query compiled for the first time): run it before serving, not as the interval job where it
    # raced the rest of start-up (the heap freeze holds the GIL) and overran its 0.5 s in the demo.
    await asyncio.to_thread(PolicyScheduler._safe(sched.tick))
    sched.start(tick_now=False)
    ingest = app.state.ingest
    ingest.watch_certain_faults(
        CertainFaultWatch(
            exited_phases=policy.detection.heartbeat.exited_phases,
            fault_gauges=CERTAIN_FAULT_GAUGES,
            notify=sched.nudge,
        )
    )
    try:
        yield
    finally:
        ingest.watch_certain_faults(None)
        # off the loop: it waits for a tick and writes rollups and the lease (requests finishing)
        await asyncio.to_thread(sched.stop)
