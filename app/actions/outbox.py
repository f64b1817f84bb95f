"""The one outbox: hand committed recovery actions and alert deliveries to Celery, and hand
them again.

A row is sent only after the transaction that created it committed (the caller wakes the
dispatcher after its commit; a periodic pass picks up rows committed elsewhere, by a worker or
an API request, after flushing the alert inbox, ``app.incidents.alert_inbox``). Sending is
at-least-once: a row is marked dispatched after the broker accepted it; if the broker is down
nothing is marked and the next pass tries again; a row sent but never
started (lost by the broker), or whose worker's lease ran out, is sent again (actions after
``redispatch_after``, alert deliveries after ``alert_grace``). Duplicates are harmless: the
task's claim makes them no-ops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from celery import Celery
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from app.actions.kinds import task_name
from app.alerts import queue as alert_queue
from app.core.db import table_of
from app.incidents.alert_inbox import flush_alerts
from app.models._types import utcnow
from app.models.action import ActionStatus, RecoveryAction
from app.policy.plans import CLUSTER_QUEUE

log = logging.getLogger("rlguard.outbox")


@dataclass(frozen=True, slots=True)
class DueAction:
    id: int
    idempotency_key: str
    action: str
    queue: str


def due_for_dispatch(
    session: Session,
    *,
    now: datetime | None = None,
    redispatch_after: float = 30.0,
    limit: int = 200,
) -> list[DueAction]:
    """Actions to (re)send: never sent, sent but not started in time, or whose worker's lease ran out."""
    now = now or utcnow()
    stale = now - timedelta(seconds=redispatch_after)
    rows = session.exec(
        select(RecoveryAction)
        .where(
            sa.or_(
                # A row under a guard-rail's backoff waits for its ``not_before``; ``dry_run``
                # rows match nothing here, so they are never sent (app/guardrails/gate.py).
                sa.and_(
                    col(RecoveryAction.status) == ActionStatus.pending.value,
                    sa.or_(
                        col(RecoveryAction.not_before).is_(None),
                        col(RecoveryAction.not_before) <= now,
                    ),
                ),
                sa.and_(
                    col(RecoveryAction.status) == ActionStatus.dispatched.value,
                    col(RecoveryAction.dispatched_at) < stale,
                ),
                sa.and_(
                    col(RecoveryAction.status) == ActionStatus.running.value,
                    col(RecoveryAction.lease_until) < now,
                    sa.or_(
                        col(RecoveryAction.dispatched_at).is_(None),
                        col(RecoveryAction.dispatched_at) < stale,
                    ),
                ),
            )
        )
        .order_by(col(RecoveryAction.id))
        .limit(limit)
    ).all()
    return [DueAction(r.id, r.idempotency_key, r.action, r.queue) for r in rows]  # type: ignore[arg-type]


def mark_dispatched(session: Session, *, action_id: int, now: datetime | None = None) -> None:
    now = now or utcnow()
    t = table_of(RecoveryAction)
    session.execute(
        sa.update(t)
        .where(
            t.c.id == action_id,
            t.c.status.in_([ActionStatus.pending.value, ActionStatus.dispatched.value]),
        )
        .values(
            status=ActionStatus.dispatched.value,
            dispatched_at=now,
            dispatch_count=t.c.dispatch_count + 1,
        )
    )
    # A running action with an expired lease stays "running" until a worker claims it again.
    session.execute(
        sa.update(t)
        .where(t.c.id == action_id, t.c.status == ActionStatus.running.value)
        .values(dispatched_at=now, dispatch_count=t.c.dispatch_count + 1)
    )


@dataclass(slots=True)
class DispatchReport:
    sent: int = 0
    pending: int = 0
    alerts_sent: int = 0
    error: str | None = None


class OutboxDispatcher:
    def __init__(
        self,
        *,
        engine: Engine,
        celery_app: Celery,
        redispatch_after: float = 30.0,
        alert_grace: timedelta = timedelta(seconds=60),
    ) -> None:
        self.engine = engine
        self.celery = celery_app
        self.redispatch_after = redispatch_after
        self.alert_grace = alert_grace
        self._broker_down = False

    def dispatch_due(self, now: datetime | None = None) -> DispatchReport:
        """One pass: the actions due, then (the broker still up) the alert deliveries due."""
        now = now or utcnow()
        report = DispatchReport()
        self._dispatch_actions(report, now)
        if report.error is None:
            self._dispatch_alerts(report, now)
        if report.error is None and self._broker_down:
            log.info("broker reachable again; outbox drained")
            self._broker_down = False
        return report

    def _dispatch_actions(self, report: DispatchReport, now: datetime) -> None:
        with Session(self.engine) as session:
            due = due_for_dispatch(session, now=now, redispatch_after=self.redispatch_after)
        report.pending = len(due)
        for row in due:
            try:
                self.celery.send_task(
                    task_name(row.action),
                    args=[row.id, row.idempotency_key],
                    queue=row.queue,
                    retry=False,
                )
            except Exception as exc:  # kombu/redis raise many types; all mean "not sent now"
                self._refused(report, exc, f"{len(due)} action(s)")
                return
            with Session(self.engine) as session:
                mark_dispatched(session, action_id=row.id, now=now)
                session.commit()
            report.sent += 1

    def _dispatch_alerts(self, report: DispatchReport, now: datetime) -> None:
        with Session(self.engine, expire_on_commit=False) as session:
            # The timeline entries others committed (a worker, an API request): their
            # deliveries are built now, and sent in this same pass.
            flush_alerts(session, now=now, ask_muted=False)
            session.commit()
            ids = alert_queue.undispatched(session) + [
                i for i, _ in alert_queue.due_for_dispatch(session, now=now, grace=self.alert_grace)
            ]
            ids = list(dict.fromkeys(ids))
            if not ids:
                return
            refused: list[Exception] = []

            def enqueue(delivery_id: int, eta: datetime) -> None:
                try:
                    self.celery.send_task(
                        alert_queue.DELIVER_TASK,
                        args=[delivery_id],
                        eta=eta,
                        queue=CLUSTER_QUEUE,
                        retry=False,
                    )
                except Exception as exc:
                    refused.append(exc)
                    raise

            report.alerts_sent = alert_queue.dispatch(session, ids=ids, enqueue=enqueue, now=now)
            session.commit()
        report.pending += len(ids)
        if refused:
            self._refused(report, refused[0], f"{len(ids) - report.alerts_sent} alert(s)")

    def _refused(self, report: DispatchReport, exc: Exception, what: str) -> None:
        report.error = f"{type(exc).__name__}: {exc}"
        if not self._broker_down:
            log.warning("broker unavailable, %s wait in the outbox: %s", what, report.error)
        self._broker_down = True
