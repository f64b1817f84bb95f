"""Carrying out one action on a worker: claim it, run its adapter, record the result.

The Celery task (``app.tasks.recovery_tasks``) only hands over the ids and turns ``RetryLater``
into a task retry. Here: transient errors give the claim back and ask for a retry with
exponential backoff, a bounded number of times; a claim held by another worker is retried after
that worker's lease. While the adapter runs, the worker keeps renewing its lease, and once the
adapter has run its result is recorded with bounded retries: an action outliving one lease or a
database outage must not run twice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.actions.errors import ActionError, TransientActionError
from app.actions.machine import (
    ActionSnapshot,
    ClaimOutcome,
    claim_action,
    finish_action,
    release_for_retry,
    renew_action_lease,
)

log = logging.getLogger("rlguard.actions.runner")

# How long a worker keeps trying to record an adapter's result through a database outage.
RECORD_RESULT_DEADLINE_SECONDS = 120.0

Adapter = Callable[[ActionSnapshot], dict[str, Any]]


class RetryLater(Exception):
    """Run the task again after ``countdown`` seconds (``cause``: why, if an error)."""

    def __init__(self, countdown: float, cause: BaseException | None = None) -> None:
        super().__init__(f"retry in {countdown:.1f}s")
        self.countdown = countdown
        self.cause = cause


@dataclass(frozen=True, slots=True)
class RunLimits:
    lease_seconds: float
    max_attempts: int  # adapter runs of one action, across tasks and workers
    max_retries: int  # retries of one task
    retries: int  # retries this task already had


def backoff(retries: int) -> float:
    return float(min(60, 2**retries))


def run_action(
    engine: Engine,
    *,
    action_id: int,
    idempotency_key: str,
    worker: str,
    adapters: Mapping[str, Adapter],
    limits: RunLimits,
    transient: tuple[type[BaseException], ...] = (),
) -> dict[str, Any]:
    """Claim, run and record one action; raises ``RetryLater`` when the task should run again.

    ``transient`` adds the caller's own retryable errors (a Celery soft time limit) to
    ``TransientActionError`` and a database that went away.
    """
    retryable: tuple[type[BaseException], ...] = (
        TransientActionError,
        OperationalError,
        *transient,
    )
    action = _claim(engine, action_id, idempotency_key, worker, limits)
    if not isinstance(action, ActionSnapshot):
        return action
    adapter = adapters.get(action.action)
    ok, result, error = False, None, None
    try:
        if adapter is None:
            raise ActionError(f"no adapter for action {action.action!r}")
        if action.attempts > limits.max_attempts:
            raise ActionError(f"gave up after {action.attempts - 1} attempts")
        with lease_kept(engine, action_id, worker, limits.lease_seconds):
            result = adapter(action)
        ok = True
    except retryable as exc:
        if limits.retries < limits.max_retries and action.attempts < limits.max_attempts:
            with Session(engine) as session:
                release_for_retry(session, action_id=action_id, worker=worker, error=str(exc))
                session.commit()
            raise RetryLater(backoff(limits.retries), exc) from exc
        error = f"{type(exc).__name__}: {exc}"
    except ActionError as exc:
        error = str(exc)
    except Exception as exc:  # a bug or an unexpected library error: record it, do not hide it
        log.exception("action %s (%s) crashed", action_id, action.action)
        error = f"{type(exc).__name__}: {exc}"
    recorded = record_result(engine, action_id, worker, ok=ok, result=result, error=error)
    log.info(
        "action %s %s: %s", action_id, action.action, "succeeded" if ok else f"failed: {error}"
    )
    return {
        "outcome": "succeeded" if ok else "failed",
        "recorded": recorded,
        "result": result,
        "error": error,
    }


def _claim(
    engine: Engine, action_id: int, idempotency_key: str, worker: str, limits: RunLimits
) -> ActionSnapshot | dict[str, Any]:
    """The claimed action, or the task's answer when there is nothing to run now."""
    try:
        with Session(engine, expire_on_commit=False) as session:
            claim = claim_action(
                session,
                action_id=action_id,
                idempotency_key=idempotency_key,
                worker=worker,
                lease_seconds=limits.lease_seconds,
            )
            session.commit()
    except OperationalError as exc:
        raise RetryLater(backoff(limits.retries), exc) from exc
    if claim.outcome is ClaimOutcome.busy:
        raise RetryLater(claim.retry_in or limits.lease_seconds)
    if claim.outcome is not ClaimOutcome.claimed:
        log.info("action %s not run: %s (%s)", action_id, claim.outcome.value, claim.why)
        return {"outcome": claim.outcome.value, "why": claim.why}
    assert claim.action is not None
    return claim.action


@contextmanager
def lease_kept(engine: Engine, action_id: int, worker: str, lease_seconds: float) -> Iterator[None]:
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


def record_result(
    engine: Engine,
    action_id: int,
    worker: str,
    *,
    ok: bool,
    result: dict[str, Any] | None,
    error: str | None,
    deadline_seconds: float = RECORD_RESULT_DEADLINE_SECONDS,
) -> bool:
    """Record the outcome, retrying through a database outage (the adapter must not re-run)."""
    deadline = time.monotonic() + deadline_seconds
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
