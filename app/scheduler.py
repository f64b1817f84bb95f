"""The server's scheduled work: the policy tick, outbox dispatch, approval expiry, rollups,
alert reminders, retention.

The schedule is a table (:meth:`PolicyScheduler.schedule`); each job's body lives in its
subsystem. Only the replica holding the lease (``app.core.lease``, renewed by each tick) runs
them; the others skip every job until it expires, except that their rollup job still forgets
silent series.

The tick builds the engine's :class:`World` from the in-process series store, the ingest
service's participant table and the node table, runs :class:`PolicyEngine`, writes its
decisions in short transactions ingest's commits may go between (``app.incidents.tick_writes``)
and wakes the dispatcher. A batch carrying a fault that needs no window (``app.ingest.certain``)
calls :meth:`PolicyScheduler.nudge` once committed: the event thread runs the same tick at once,
on the lease holder, under the tick's lock, so the early and the interval tick never both plan
a fault. Rollups are written by the holder only, fenced by the lease (``app.series.rollups``),
with a last pass before it lets the lease go.
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

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import Session, col, select

from app.actions.outbox import OutboxDispatcher
from app.alerts.service import run_alert_maintenance
from app.core.gc_tuning import FreezeOnGrowth
from app.core.lease import HeldLease
from app.core.wakeup import WakeThread
from app.core.write_turns import WriteTurns
from app.incidents.alert_inbox import ask_muted_again
from app.incidents.approvals import expire_approvals
from app.incidents.held_plans import release_ended_holds
from app.incidents.queries import (
    open_incident_failures,
    open_incidents_for_engine,
    open_incidents_whose_plan_succeeded,
)
from app.incidents.retention import delete_resolved_before
from app.incidents.tick_writes import write_decisions
from app.ingest.certain import CertainFaultWatch
from app.models._types import utcnow
from app.models.cluster import Node
from app.models.incident import Incident, IncidentStatus
from app.policy.clock import Clock, WallClock
from app.policy.detectors import ExternalAlertDetector, ExternalAlerts, default_detectors
from app.policy.engine import PolicyEngine, TickResult
from app.policy.policy_file import Policy, default_policy
from app.policy.world import ParticipantSource, World, participants_from_ingest
from app.series.rollups import RollupWriter
from app.series.store import SeriesStore
from app.silences.windows import maintenance_at
from recovery.protocol import metric_names as m

log = logging.getLogger("rlguard.scheduler")

# 0/1 gauges whose rise to 1 is a fault with no window to wait for (the event path), an engine's
# process gone among them; exits and Ray deaths come as participant phases (the policy's
# ``detection.heartbeat.exited_phases``).
CERTAIN_FAULT_GAUGES = (m.GPU_LOST, m.ROLLOUT_ENGINE_PROCESS_DEAD)


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
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.lease = HeldLease(engine, holder=self.holder, seconds=lease_seconds)
        self.dispatch_interval = dispatch_interval
        self.retention_days = retention_days
        self.rollups = rollups
        self.dry_run = dry_run  # Settings.automation.dry_run: plans are shown, never run
        self.write_turns = write_turns  # SQLite: ingest's commits go between the tick's writes
        self.external = ExternalAlerts()
        self.policy_engine = PolicyEngine(
            self.policy,
            detectors=[
                *default_detectors(self.policy),
                ExternalAlertDetector(self.policy, self.external),
            ],
        )
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
        return self.lease.held()

    def _renew(self) -> bool:
        held, taken = self.lease.renew()
        if taken:
            self._needs_restore = True  # the database is the truth after a change of holder
        return held

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
        if not self.is_leader():
            return
        # Muted alerts asked again (app.incidents.alert_inbox), then reminders and purge.
        queued = ask_muted_again(self.engine, now=utcnow())
        if run_alert_maintenance(self.engine) or queued:
            self.wake_dispatcher()

    def expire(self) -> None:
        if not self.is_leader():
            return
        with Session(self.engine) as session:
            n = expire_approvals(session)
            session.commit()
        if n:
            log.info("%d approval(s) expired", n)

    def release_holds(self) -> None:
        """Plan what an ended silence or maintenance window held (``app.incidents.held_plans``).
        Under the tick's lock: a tick planning the same incident's escalation at the same
        moment would otherwise race it."""
        if not self.is_leader():
            return
        with self._lock, Session(self.engine, expire_on_commit=False) as session:
            out = release_ended_holds(
                session, policy=self.policy, dry_run=self.dry_run, now=utcnow()
            )
            session.commit()
        if out.new_actions or out.approvals:
            self.wake_dispatcher()

    def retention(self) -> None:
        if not self.is_leader():
            return
        removed = delete_resolved_before(
            self.engine, utcnow() - timedelta(days=self.retention_days)
        )
        if removed:
            log.info("retention removed %d resolved incident(s)", removed)

    def rollup(self) -> int:
        """One rollup pass if this replica holds the lease; returns the rows written."""
        return 0 if self.rollups is None else self.rollups.run_scheduled(self.lease)

    # -- lifecycle ---------------------------------------------------------------------------

    def schedule(self) -> list[tuple[str, Callable[[], Any], float]]:
        """The jobs and their intervals (seconds); each body lives in its subsystem."""
        jobs: list[tuple[str, Callable[[], Any], float]] = [
            ("tick", self.tick, self.policy.tick_seconds),  # the policy engine, its decisions
            ("dispatch", self.dispatch, self.dispatch_interval),  # app.actions.outbox
            ("expire", self.expire, 10),  # app.incidents.approvals
            ("holds", self.release_holds, 5),  # app.incidents.held_plans
            ("retention", self.retention, 6 * 3600),  # app.incidents.retention
            # alerts: muted alerts asked again (app.incidents.alert_inbox), repeat reminders
            # queued and old deliveries purged (app.alerts.service)
            ("alerts", self.alert_maintenance, 5),
        ]
        if self.rollups is not None:  # app.series.rollups
            jobs.append(("rollups", self.rollup, self.rollups.settings.rollup_interval_seconds))
        return jobs

    def start(self, *, tick_now: bool = True) -> None:
        """Run the jobs; the first tick at once, or one interval from now (``tick_now=False``,
        when the caller has just run one)."""
        sched = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(4)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 5},
            timezone=UTC,
        )
        for job_id, job, seconds in self.schedule():
            # APScheduler reads next_run_time=None as "paused": only the tick is given one.
            first: dict[str, Any] = {}
            if job_id == "tick":
                first["next_run_time"] = datetime.now(UTC) + timedelta(
                    seconds=0 if tick_now else seconds
                )
            sched.add_job(self._safe(job), "interval", seconds=seconds, id=job_id, **first)
        if self.rollups is not None:
            self.rollups.scheduled_by = self.holder
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
            self.rollups.lease_released()
        self.lease.release()

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
