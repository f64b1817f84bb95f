"""The outbox dispatcher: hand committed recovery actions to Celery, and hand them again.

A row is sent only after the transaction that created it committed (the caller wakes the
dispatcher after its commit). Sending is at-least-once: a row is marked dispatched after the
broker accepted it; if the broker is down nothing is marked and the next pass tries again; a row
sent but never started (lost by the broker), or whose worker's lease ran out, is sent again
after ``redispatch_after``. Duplicates are harmless: the task's claim makes them no-ops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery import Celery
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.services.actions import due_for_dispatch, mark_dispatched, task_name

log = logging.getLogger("rlguard.outbox")


@dataclass(slots=True)
class DispatchReport:
    sent: int = 0
    pending: int = 0
    error: str | None = None


class OutboxDispatcher:
    def __init__(
        self, *, engine: Engine, celery_app: Celery, redispatch_after: float = 30.0
    ) -> None:
        self.engine = engine
        self.celery = celery_app
        self.redispatch_after = redispatch_after
        self._broker_down = False

    def dispatch_due(self) -> DispatchReport:
        report = DispatchReport()
        with Session(self.engine) as session:
            due = due_for_dispatch(session, redispatch_after=self.redispatch_after)
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
                report.error = f"{type(exc).__name__}: {exc}"
                if not self._broker_down:
                    log.warning(
                        "broker unavailable, %d action(s) wait in the outbox: %s",
                        len(due),
                        report.error,
                    )
                self._broker_down = True
                break
            with Session(self.engine) as session:
                mark_dispatched(session, action_id=row.id)
                session.commit()
            report.sent += 1
        if report.error is None and self._broker_down:
            log.info("broker reachable again; outbox drained")
            self._broker_down = False
        return report
