"""Celery task `alerts.deliver`: send one alert delivery row (and the events grouped with it).

The outbox dispatcher (`app.actions.outbox`) sends the task once the row committed, and again
when it was lost. A task gets only the row id. It claims the row (re-reading the database: a row already sent,
grouped into another message or claimed by a live worker is a no-op), renders the message from
the stored events, posts it, and records the outcome. Alerts ride the `cluster` queue beside
recovery actions, so a task never holds its worker for long: a couple of quick tries within
about 20 s, and anything slower (a Slack `Retry-After`, a WeCom rate limit, an outage) becomes
a later task at the row's `next_attempt_at`, bounded by `TaskRetryPolicy.max_task_runs`.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import lru_cache

from celery import Task
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.alerts.delivery import AlertDeliveryClient, RetryPolicy
from app.alerts.errors import AlertError
from app.alerts.queue import (
    DELIVER_TASK,
    SendPlan,
    TaskRetryPolicy,
    Wait,
    claim,
    record_result,
)
from app.alerts.ratelimit import RateLimiter, RedisRateLimiter, SlidingWindowRateLimiter
from app.alerts.render import render_batch
from app.alerts.service import current_config
from app.core.config import get_settings
from app.core.db import make_engine
from app.models._types import utcnow
from app.models.alert import DeliveryState
from app.policy.plans import CLUSTER_QUEUE
from app.tasks.celery_app import celery_app

log = logging.getLogger("rlguard.tasks.alerts")

MAX_DB_RETRIES = 5
# Quick in-task tries only; see the module docstring.
IN_TASK_POLICY = RetryPolicy(
    max_attempts=2,
    base_delay_s=0.5,
    max_delay_s=2.0,
    max_retry_after_s=5.0,
    deadline_s=20.0,
    connect_timeout_s=3.0,
    read_timeout_s=5.0,
)


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
    engine = _engine()
    try:
        with Session(engine, expire_on_commit=False) as session:
            plan = claim(
                session,
                delivery_id=delivery_id,
                config=config,
                now=utcnow(),
                retry=TaskRetryPolicy.from_config(config),
            )
    except OperationalError as exc:
        raise task.retry(
            exc=exc, countdown=min(60, 2**task.request.retries), max_retries=MAX_DB_RETRIES
        ) from exc
    except AlertError as exc:
        log.warning("alert delivery %s not sent: %s", delivery_id, exc)
        return "missing"
    if plan is None:
        return "nothing to do"
    if isinstance(plan, Wait):
        enqueue_delivery(delivery_id, plan.until)
        return f"waiting until {plan.until.isoformat()}"
    return _send(plan)


def _send(plan: SendPlan) -> str:
    config = current_config()
    channel = config.channel(plan.channel)
    message = render_batch(plan.batch, channel=channel, config=config)
    with AlertDeliveryClient(
        config, policy=IN_TASK_POLICY, limiter=shared_rate_limiter()
    ) as client:
        outcome = client.send(plan.channel, message, start_part=plan.start_part)
    with Session(_engine(), expire_on_commit=False) as session:
        row = record_result(
            session,
            lead_id=plan.lead_id,
            record=outcome,
            now=utcnow(),
            retry=TaskRetryPolicy.from_config(config),
        )
    if row.state == DeliveryState.RETRYING.value and row.next_attempt_at is not None:
        try:
            enqueue_delivery(plan.lead_id, row.next_attempt_at)
        except Exception:  # the broker is down: the sweeper sends it at next_attempt_at
            log.exception("retry of alert delivery %d not enqueued; the sweeper will", plan.lead_id)
    return row.state


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
