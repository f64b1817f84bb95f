"""Celery tasks that carry out recovery actions (one task per action, ``recovery.<action>``).

A task gets only the action id and its idempotency key and hands them to the action runner
(``app.actions.runner``: claim, adapter under a kept lease, result recorded through a database
outage); a ``RetryLater`` from it becomes a Celery retry.
"""

from __future__ import annotations

import os
import socket
from functools import lru_cache, partial
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy.engine import Engine

from app.actions.kinds import task_name
from app.actions.runner import RetryLater, RunLimits, run_action
from app.actions.stacks import attach_stacks
from app.core.config import get_settings
from app.core.db import make_engine
from app.tasks.celery_app import celery_app
from app.tasks.recovery_adapters import ADAPTERS, ActionContext

MAX_RETRIES = 8


@lru_cache(maxsize=1)
def _engine() -> Engine:
    settings = get_settings()
    return make_engine(settings.db_url, sqlite_synchronous=settings.sqlite_synchronous)


def _context() -> ActionContext:
    rs = get_settings().recovery
    root = rs.run_root or (get_settings().data_dir / "runs")
    return ActionContext(
        run_root=root,
        launcher=rs.launcher,
        launcher_timeout=rs.launcher_timeout,
        attach_stacks=partial(attach_stacks, _engine(), worker_id()),
    )


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_task(task: Task, action_id: int, idempotency_key: str) -> dict[str, Any]:
    rs = get_settings().recovery
    context = _context()
    try:
        return run_action(
            _engine(),
            action_id=action_id,
            idempotency_key=idempotency_key,
            worker=worker_id(),
            adapters={name: partial(adapter, context) for name, adapter in ADAPTERS.items()},
            limits=RunLimits(
                lease_seconds=rs.action_lease_seconds,
                max_attempts=rs.max_attempts,
                max_retries=MAX_RETRIES,
                retries=task.request.retries,
            ),
            transient=(SoftTimeLimitExceeded,),
        )
    except RetryLater as later:
        raise task.retry(
            exc=later.cause, countdown=later.countdown, max_retries=MAX_RETRIES
        ) from later.cause


def _register(action: str) -> None:
    def body(self: Task, action_id: int, idempotency_key: str) -> dict[str, Any]:
        return run_task(self, action_id, idempotency_key)

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
