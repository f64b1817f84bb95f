"""Sending one alert delivery row on a worker: claim it, render, post, record the outcome.

The Celery task (`app.tasks.alert_tasks`) hands over the row id and runs the task again at
`DeliveryOutcome.again_at` when there is one. Alerts ride the `cluster` queue beside recovery
actions, so a send never holds its worker for long: a couple of quick tries within about
20 s (`IN_TASK_POLICY`), and anything slower (a Slack `Retry-After`, a WeCom rate limit, an
outage) becomes a later run at the row's `next_attempt_at`, bounded by
`TaskRetryPolicy.max_task_runs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.alerts.config import AlertsConfig
from app.alerts.delivery import AlertDeliveryClient, RetryPolicy
from app.alerts.queue import SendPlan, TaskRetryPolicy, Wait, claim, record_result
from app.alerts.ratelimit import RateLimiter
from app.alerts.render import render_batch
from app.models._types import utcnow
from app.models.alert import DeliveryState

IN_TASK_POLICY = RetryPolicy(
    max_attempts=2,
    base_delay_s=0.5,
    max_delay_s=2.0,
    max_retry_after_s=5.0,
    deadline_s=20.0,
    connect_timeout_s=3.0,
    read_timeout_s=5.0,
)


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    summary: str  # what the task reports
    row_id: int  # the row to run again (a batch's lead after a send)
    again_at: datetime | None = None
    # A retry after a failed send: if it cannot be enqueued now, the outbox sweeps it later.
    retrying: bool = False


def claim_row(engine: Engine, delivery_id: int, *, config: AlertsConfig) -> SendPlan | Wait | None:
    """What to do with `delivery_id` now (`app.alerts.queue.claim`, committed); raises
    `AlertError` for a row that is gone and `OperationalError` when the database is away."""
    with Session(engine, expire_on_commit=False) as session:
        return claim(
            session,
            delivery_id=delivery_id,
            config=config,
            now=utcnow(),
            retry=TaskRetryPolicy.from_config(config),
        )


def deliver_claimed(
    engine: Engine,
    delivery_id: int,
    plan: SendPlan | Wait | None,
    *,
    config: AlertsConfig,
    limiter: RateLimiter,
) -> DeliveryOutcome:
    """Carry out what `claim_row` decided: nothing, wait, or send and record the outcome."""
    if plan is None:
        return DeliveryOutcome("nothing to do", delivery_id)
    if isinstance(plan, Wait):
        return DeliveryOutcome(f"waiting until {plan.until.isoformat()}", delivery_id, plan.until)
    return _send(engine, plan, config, limiter)


def _send(
    engine: Engine, plan: SendPlan, config: AlertsConfig, limiter: RateLimiter
) -> DeliveryOutcome:
    channel = config.channel(plan.channel)
    message = render_batch(plan.batch, channel=channel, config=config)
    with AlertDeliveryClient(config, policy=IN_TASK_POLICY, limiter=limiter) as client:
        outcome = client.send(plan.channel, message, start_part=plan.start_part)
    with Session(engine, expire_on_commit=False) as session:
        row = record_result(
            session,
            lead_id=plan.lead_id,
            record=outcome,
            now=utcnow(),
            retry=TaskRetryPolicy.from_config(config),
        )
    if row.state == DeliveryState.RETRYING.value and row.next_attempt_at is not None:
        return DeliveryOutcome(row.state, plan.lead_id, row.next_attempt_at, retrying=True)
    return DeliveryOutcome(row.state, plan.lead_id)
