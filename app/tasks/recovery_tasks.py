"""Celery tasks that carry out recovery actions (one task per action, ``recovery.<action>``).

A task gets only the action id and its idempotency key. It claims the row (re-reading the
database), runs the adapter (which checks the world before acting), and records the result.
Transient errors give the claim back and retry with exponential backoff, a bounded number of
times; a claim held by another worker is retried after that worker's lease. While the adapter
runs, the worker keeps renewing its lease, and once the adapter has run its result is recorded
with bounded retries: an action outliving one lease or a database outage must not run twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.core.config import get_settings
from app.core.db import make_engine
from app.services.actions import (
    ClaimOutcome,
    claim_action,
    finish_action,
    release_for_retry,
    renew_action_lease,
    task_name,
)
from app.tasks.celery_app import celery_app
from app.tasks.recovery_adapters import (
    ADAPTERS,
    ActionContext,
    ActionError,
    TransientActionError,
)

log = logging.getLogger("rlguard.tasks")

MAX_RETRIES = 8
# How long a worker keeps trying to record an adapter's result through a database outage.
RECORD_RESULT_DEADLINE_SECONDS = 120.0


@lru_cache(maxsize=1)
def _engine() -> Engine:
    settings = get_settings()
    return make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)


def _context() -> ActionContext:
    rs = get_settings().recovery
    root = rs.run_root or (get_settings().data_dir / "runs")
    return ActionContext(run_root=root, launcher=rs.launcher, launcher_timeout=rs.launcher_timeout)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _backoff(retries: int) -> float:
    return float(min(60, 2**retries))


def run_action(task: Task, action_id: int, idempotency_key: str) -> dict[str, Any]:
    rs = get_settings().recovery
    me = worker_id()
    engine = _engine()
    try:
        with Session(engine, expire_on_commit=False) as session:
            claim = claim_action(
                session,
                action_id=action_id,
                idempotency_key=idempotency_key,
                worker=me,
                lease_seconds=rs.action_lease_seconds,
            )
            session.commit()
    except OperationalError as exc:
        raise task.retry(
            exc=exc, countdown=_backoff(task.request.retries), max_retries=MAX_RETRIES
        ) from exc
    if claim.outcome is ClaimOutcome.busy:
        raise task.retry(countdown=claim.retry_in, max_retries=MAX_RETRIES)
    if claim.outcome is not ClaimOutcome.claimed:
        log.info("action %s not run: %s (%s)", action_id, claim.outcome.value, claim.why)
        return {"outcome": claim.outcome.value, "why": claim.why}
    action = claim.action
    assert action is not None
    adapter = ADAPTERS.get(action.action)
    ok, result, error = False, None, None
    try:
        if adapter is None:
            raise ActionError(f"no adapter for action {action.action!r}")
        if action.attempts > rs.max_attempts:
            raise ActionError(f"gave up after {action.attempts - 1} attempts")
        with _lease_kept(engine, action_id, me, rs.action_lease_seconds):
            result = adapter(_context(), action)
        ok = True
    except (TransientActionError, SoftTimeLimitExceeded, OperationalError) as exc:
        if task.request.retries < MAX_RETRIES and action.attempts < rs.max_attempts:
            with Session(engine) as session:
                release_for_retry(session, action_id=action_id, worker=me, error=str(exc))
                session.commit()
            raise task.retry(
                exc=exc, countdown=_backoff(task.request.retries), max_retries=MAX_RETRIES
            ) from exc
        error = f"{type(exc).__name__}: {exc}"
    except ActionError as exc:
        error = str(exc)
    except Exception as exc:  # a bug or an unexpected library error: record it, do not hide it
        log.exception("action %s (%s) crashed", action_id, action.action)
        error = f"{type(exc).__name__}: {exc}"
    recorded = _record_result(engine, action_id, me, ok=ok, result=result, error=error)
    log.info(
        "action %s %s: %s", action_id, action.action, "succeeded" if ok else f"failed: {error}"
    )
    return {
        "outcome": "succeeded" if ok else "failed",
        "recorded": recorded,
        "result": result,
        "error": error,
    }


@contextmanager
def _lease_kept(
    engine: Engine, action_id: int, worker: str, lease_seconds: float
) -> Iterator[None]:
    """Renew the action's lease every third of it until the block ends (a daemon thread)."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_seconds / 3):
            try:
                with Session(engine) as session:
                    held = renew_action_lease(
                        session, action_id=action_id, worker=worker, lease_seconds=lease_seconds
                    )
                    session.commit()
            except OperationalError as exc:  # database away: try again at the next period
                log.warning("action %s: lease renewal failed, will retry: %s", action_id, exc)
                continue
            if not held:
                log.warning("action %s: lease lost to another worker", action_id)
                return

    thread = threading.Thread(target=renew, name=f"lease-action-{action_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def _record_result(
    engine: Engine,
    action_id: int,
    worker: str,
    *,
    ok: bool,
    result: dict[str, Any] | None,
    error: str | None,
) -> bool:
    """Record the outcome, retrying through a database outage (the adapter must not re-run)."""
    deadline = time.monotonic() + RECORD_RESULT_DEADLINE_SECONDS
    pause = 0.5
    while True:
        try:
            with Session(engine) as session:
                recorded = finish_action(
                    session, action_id=action_id, worker=worker, ok=ok, result=result, error=error
                )
                session.commit()
            return recorded
        except OperationalError as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("action %s: recording the result failed, will retry: %s", action_id, exc)
            time.sleep(pause)
            pause = min(pause * 2, 8.0)


def _register(action: str) -> None:
    def body(self: Task, action_id: int, idempotency_key: str) -> dict[str, Any]:
        return run_action(self, action_id, idempotency_key)

    body.__name__ = f"task_{action}"
    celery_app.task(
        bind=True,
        name=task_name(action),
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=MAX_RETRIES,
    )(body)


for _action in ADAPTERS:
    _register(_action)
