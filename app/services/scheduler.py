"""The server's scheduled work: the policy tick, outbox dispatch, approval expiry, retention.

Only one server replica runs it: each tick renews a lease row in the database (the
``scheduler_lease`` table; a conditional UPDATE is atomic on SQLite and PostgreSQL). A replica
that is not the holder skips every job until the lease expires.

The tick builds the engine's :class:`World` from the in-process series store, the ingest
service's participant table and the node table, runs :class:`PolicyEngine`, writes its
decisions in one transaction and then wakes the dispatcher, so that an action reaches the
broker right after its outbox row committed.
"""

from __future__ import annotations

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
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlmodel import Session, col, select

from app.models._types import utcnow
from app.models.action import SchedulerLease
from app.models.cluster import Node
from app.models.incident import Incident, IncidentStatus
from app.policy.clock import Clock, WallClock
from app.policy.detectors import default_detectors
from app.policy.engine import PolicyEngine, TickResult
from app.policy.external import ExternalAlertDetector, ExternalAlerts
from app.policy.policy_file import Policy, default_policy, load_policy
from app.policy.world import ParticipantView, World
from app.services.alerts import run_alert_maintenance
from app.services.approvals import expire_approvals
from app.services.incidents import (
    open_incident_failures,
    open_incidents_for_engine,
    persist_decisions,
)
from app.services.outbox import OutboxDispatcher
from app.services.series_store import SeriesStore

log = logging.getLogger("rlguard.scheduler")

LEASE_NAME = "policy-scheduler"


def try_lease(engine: Engine, *, holder: str, ttl: float, name: str = LEASE_NAME) -> bool:
    """Take or renew the lease; True while ``holder`` has it."""
    now = utcnow()
    t = SchedulerLease.__table__  # type: ignore[attr-defined]
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


def release_lease(engine: Engine, *, holder: str, name: str = LEASE_NAME) -> None:
    t = SchedulerLease.__table__  # type: ignore[attr-defined]
    with Session(engine) as session:
        session.execute(sa.delete(t).where(t.c.name == name, t.c.holder == holder))
        session.commit()


ParticipantSource = Callable[[], list[ParticipantView]]


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
        self._needs_restore = True
        self._lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self.last_tick: TickResult | None = None
        self.last_tick_seconds = 0.0

    # -- lease ----------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return time.monotonic() < self._leader_until

    def _renew(self) -> bool:
        try:
            ok = try_lease(self.engine, holder=self.holder, ttl=self.lease_seconds)
        except SQLAlchemyError as exc:
            log.warning("scheduler lease not renewed: %s", exc)
            ok = False
        if ok:
            if not self.is_leader():
                log.info("scheduler lease taken by %s", self.holder)
                self._needs_restore = True
            self._leader_until = time.monotonic() + self.lease_seconds * 0.8
        else:
            self._leader_until = 0.0
        return ok

    # -- the tick -------------------------------------------------------------------------

    def world(self, now: float) -> World:
        with Session(self.engine) as session:
            nodes = session.exec(select(Node.name, Node.last_seen_at, Node.fingerprint)).all()
        seen = {n: at.timestamp() for n, at, _ in nodes if at is not None}
        prints = {n: {str(k): str(v) for k, v in fp.items()} for n, _, fp in nodes if fp}
        return World(
            now=now,
            store=self.store,
            participants=self.participants(),
            node_last_seen=seen,
            fingerprints=prints,
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
                new_actions = False
                if result.decisions:
                    with Session(self.engine, expire_on_commit=False) as session:
                        persisted = persist_decisions(
                            session, decisions=result.decisions, policy=self.policy
                        )
                        session.commit()
                    new_actions = bool(persisted.new_actions)
                    for key in persisted.resolved_keys:
                        self.policy_engine.forget(key)
                if new_actions:
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
        """Fold in what happened outside the engine: failed recoveries, incidents closed."""
        failures = open_incident_failures(session)
        for key in list(self.policy_engine.open_incidents):
            if key not in failures:
                self.policy_engine.forget(key)
        for key, n in failures.items():
            self.policy_engine.set_recovery_failures(key, n)

    # -- other jobs -------------------------------------------------------------------------

    def dispatch(self) -> None:
        if self.dispatcher is None or not self.is_leader():
            return
        try:
            self.dispatcher.dispatch_due()
        except SQLAlchemyError as exc:
            log.warning("outbox dispatch skipped: %s", exc)

    def wake_dispatcher(self) -> None:
        sched = self._scheduler
        if sched is not None and sched.running:
            job = sched.get_job("dispatch")
            if job is not None:
                job.modify(next_run_time=datetime.now(UTC))
                return
        self.dispatch()

    def expire(self) -> None:
        if not self.is_leader():
            return
        with Session(self.engine) as session:
            n = expire_approvals(session)
            session.commit()
        if n:
            log.info("%d approval(s) expired", n)

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

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
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
            next_run_time=datetime.now(UTC),
        )
        sched.add_job(
            self._safe(self.dispatch), "interval", seconds=self.dispatch_interval, id="dispatch"
        )
        sched.add_job(self._safe(self.expire), "interval", seconds=10, id="expire")
        sched.add_job(self._safe(self.retention), "interval", hours=6, id="retention")
        # Alerts: re-enqueue lost or due deliveries, queue repeat reminders (app.services.alerts).
        sched.add_job(self._safe(lambda: self.is_leader() and run_alert_maintenance(self.engine)), "interval", seconds=5, id="alerts")
        sched.start()
        self._scheduler = sched
        log.info("policy scheduler started", extra={"holder": self.holder})

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
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

        run.__name__ = getattr(fn, "__name__", "job")
        return run


def _fresh_engine_keeping_detectors(old: PolicyEngine, policy: Policy) -> PolicyEngine:
    # Detector memory (phase clocks, counter baselines) survives a resync; incident memory is
    # rebuilt from the database, which is the truth after a failed write or a lease change.
    # So does the memory of occurrences whose incidents were closed (it only ever comes from
    # closures the database holds): the detectors still report such an occurrence, and a
    # fresh engine without it would open a second incident for it.
    return PolicyEngine(policy, detectors=old.detectors, closed_occurrences=old.closed_occurrences)


# -- wiring into the server -------------------------------------------------------------------


def participants_from_ingest(ingest: Any) -> ParticipantSource:
    def read() -> list[ParticipantView]:
        return [
            ParticipantView(
                job=p.job,
                role=p.role,
                rank=p.rank,
                node=p.node,
                phase=p.phase,
                step=p.step,
                last_heartbeat_ts=p.ts,
            )
            for p in ingest.participants()
        ]

    return read


@asynccontextmanager
async def policy_lifespan(app: Any) -> AsyncIterator[None]:
    """Run the policy scheduler inside the server (registered in ``app.main.EXTRA_LIFESPANS``)."""
    from app.tasks.settings import get_recovery_settings

    rs = get_recovery_settings()
    settings = app.state.settings
    if os.environ.get("RLGUARD_POLICY_SCHEDULER", "1") == "0":
        log.info("policy scheduler disabled (RLGUARD_POLICY_SCHEDULER=0)")
        yield
        return
    from app.tasks.celery_app import make_celery

    policy = load_policy(rs.policy_file) if rs.policy_file else default_policy()
    dispatcher = OutboxDispatcher(
        engine=app.state.engine,
        celery_app=make_celery(settings, rs),
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
    )
    app.state.policy_scheduler = sched
    sched.start()
    try:
        yield
    finally:
        sched.stop()
