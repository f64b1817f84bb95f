"""The Celery application: Redis when ``RLGUARD_REDIS_URL`` is set, otherwise a broker that
needs no server (a SQLite file under the data directory, ``app.tasks.sqlite_broker``).

Queues: ``cluster`` for cluster-wide actions and ``node.<node>`` for node-local ones (routing is
explicit: the dispatcher names the queue of every message). Tasks are idempotent, so they are
acknowledged late and given back when a worker is lost; the Redis visibility timeout is above
the longest task's time limit.

``celery_app`` is configured lazily, on first use: importing this module (every ``rlguard``
command does, to list its subcommands) reads no settings and creates no file.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]  # kombu has no type hints

from app.core.config import Settings, get_settings
from app.policy.plans import CLUSTER_QUEUE
from app.tasks import sqlite_broker

BROKER_FILE_NAME = "celery-broker.sqlite"
TASK_MODULES = ["app.tasks.recovery_tasks", "app.tasks.alert_tasks", "app.tasks.drill_tasks"]


def broker_url(settings: Settings) -> str:
    if settings.redis_url:
        return settings.redis_url
    return sqlite_broker.broker_file_url(settings.data_dir / BROKER_FILE_NAME)


def celery_config(settings: Settings) -> dict[str, object]:
    """Everything the app is configured with, broker included."""
    recovery = settings.recovery
    transport_options: dict[str, object] = {}
    transport: str | None = None
    if settings.redis_url:
        transport_options = {
            "visibility_timeout": recovery.visibility_timeout_seconds,
            "socket_timeout": recovery.broker_timeout_seconds,
            "socket_connect_timeout": recovery.broker_timeout_seconds,
        }
    else:
        transport = sqlite_broker.TRANSPORT
    return dict(
        broker_url=broker_url(settings),
        broker_transport=transport,
        task_default_queue=CLUSTER_QUEUE,
        task_queues=[Queue(CLUSTER_QUEUE)],  # type: ignore[no-untyped-call]
        task_create_missing_queues=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        task_time_limit=recovery.task_time_limit,
        task_soft_time_limit=recovery.task_time_limit * 0.9,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=recovery.broker_timeout_seconds,
        # Publishing must not hang the dispatcher when the broker is down: fail fast, the
        # outbox row stays pending and the next pass sends it.
        task_publish_retry=False,
        accept_content=["json"],
        task_serializer="json",
        enable_utc=True,
    )


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    app = Celery("rlguard", include=TASK_MODULES)
    app.conf.update(celery_config(settings))
    return app


# Configured when first used (a worker starting, a task sent), from the settings of that moment.
celery_app = Celery("rlguard", include=TASK_MODULES)
celery_app.add_defaults(lambda: celery_config(get_settings()))
