"""What runs in each ``rlguard`` process: the one file that wires the subsystems together.

- ``rlguard server``: the FastAPI app (:func:`app.main.create_app`: ingest, the series window,
  the rollups, the REST API and the dashboard), and inside it :data:`SERVER_LIFESPANS`, entered
  in order once ingest has started and left before it stops.
- ``rlguard up``: the same server, plus :data:`UP_CHILDREN`, processes that
  :class:`app.core.child_processes.ChildSupervisor` runs beside it and restarts when they die.
- ``rlguard worker``: a Celery worker (:mod:`app.tasks.worker`) consuming the queues it is given,
  with the task modules of :data:`app.tasks.celery_app.TASK_MODULES`.

State the server shares between its parts lives on ``app.state`` (never in module globals, so
that tests can run several apps side by side): see :func:`app.main.create_app`. The policy the
engine runs and the dashboard draws is loaded once, by :func:`load_running_policy`.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI

from app.core.child_processes import ChildSpec
from app.core.config import Settings, policy_variable
from app.policy.policy_file import (
    DEFAULT_POLICY_PATH,
    Policy,
    load_policy,
    parse_policy,
)
from app.scheduler import policy_lifespan
from app.tasks.worker import embedded_worker_spec

LifespanFactory = Callable[[FastAPI], AbstractAsyncContextManager[None]]
ChildFactory = Callable[[Settings], ChildSpec | None]

# Inside `rlguard server` (and `up`): the policy tick, the action outbox, approvals' expiry and
# the rollups' lease (app.scheduler); off with RLGUARD_POLICY_SCHEDULER=0.
SERVER_LIFESPANS: tuple[LifespanFactory, ...] = (policy_lifespan,)

# Beside the server of `rlguard up`: a recovery worker for the cluster queue and this node's.
UP_CHILDREN: tuple[ChildFactory, ...] = (embedded_worker_spec,)


def up_children(settings: Settings) -> list[ChildSpec]:
    """The child processes `rlguard up` supervises, for these settings."""
    specs = [factory(settings) for factory in UP_CHILDREN]
    return [s for s in specs if s is not None]


def load_running_policy(settings: Settings) -> Policy:
    """The policy file (``RLGUARD_RECOVERY_POLICY_FILE``, else the shipped one) with the
    ``RLGUARD_POLICY__*`` overrides merged over it and validated again: the one policy the
    engine runs and the dashboard draws. Raises ``PolicyFileError`` naming a bad value."""
    path = settings.recovery.policy_file
    policy = load_policy(path)
    overrides = settings.policy.file_overrides()
    if not overrides:
        return policy
    named = ", ".join(policy_variable(path) for path in settings.policy.overridden())
    source = f"{path or DEFAULT_POLICY_PATH} with {named}"
    return parse_policy(_merge(policy.model_dump(mode="json"), overrides), source=source)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
