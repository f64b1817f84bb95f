"""Celery task `alerts.deliver`: send one alert delivery row (and the events grouped with it).

The outbox dispatcher (`app.actions.outbox`) sends the task once the row committed, and again
when it was lost. A task gets only the row id and hands it to `app.alerts.sender` (claim,
render, post, record); it runs itself again when the row is not due yet or a later try was
scheduled, and retries when the database is away.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import lru_cache

from celery import Task
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from app.alerts.errors import AlertError
from app.alerts.queue import DELIVER_TASK
from app.alerts.ratelimit import RateLimiter, RedisRateLimiter, SlidingWindowRateLimiter
from app.alerts.sender import claim_row, deliver_claimed
from app.alerts.service import current_config
from app.core.config import get_settings
from app.core.db import make_engine
from app.policy.plans import CLUSTER_QUEUE
from app.tasks.celery_app import celery_app

log = logging.getLogger("rlguard.tasks.alerts")

MAX_DB_RETRIES = 5


@lru_cache(maxsize=1)
def _engine() -> Engine:
    settings = get_settings()
    return make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)


@lru_cache(maxsize=1)
def shared_rate_limiter() -> RateLimiter:
    """One limiter for every send of this process; with Redis, one for every worker."""
    settings = get_settings()
    if settings.redis_url:
        import redis

        return RedisRateLimiter(
            redis.Redis.from_url(settings.redis_url, socket_timeout=3, socket_connect_timeout=3)
        )
    return SlidingWindowRateLimiter()


def enqueue_delivery(delivery_id: int, eta: datetime) -> None:
    """Run the task for one row again at `eta` (a group window still open, a retry later)."""
    deliver.apply_async(args=[delivery_id], eta=eta, queue=CLUSTER_QUEUE, retry=False)


def run_delivery(task: Task, delivery_id: int) -> str:
    config = current_config()
    try:
        plan = claim_row(_engine(), delivery_id, config=config)
    except OperationalError as exc:
        raise task.retry(
            exc=exc, countdown=min(60, 2**task.request.retries), max_retries=MAX_DB_RETRIES
        ) from exc
    except AlertError as exc:
        log.warning("alert delivery %s not sent: %s", delivery_id, exc)
        return "missing"
    outcome = deliver_claimed(
        _engine(), delivery_id, plan, config=config, limiter=shared_rate_limiter()
    )
    if outcome.again_at is not None:
        try:
            enqueue_delivery(outcome.row_id, outcome.again_at)
        except Exception:
            if not outcome.retrying:
                raise
            # The broker is down: the outbox sweeps the row at its next_attempt_at.
            log.exception(
                "retry of alert delivery %d not enqueued; the outbox will", outcome.row_id
            )
    return outcome.summary


@celery_app.task(  # type: ignore[untyped-decorator]
    bind=True,
    name=DELIVER_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=MAX_DB_RETRIES,
    ignore_result=True,
)
def deliver(self: Task, delivery_id: int) -> str:
    return run_delivery(self, delivery_id)
