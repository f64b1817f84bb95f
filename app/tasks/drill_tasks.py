"""Celery adapters for drills (``drills.inject`` on the node's queue, ``drills.follow`` on the
cluster queue): each reads its drill id, calls :mod:`app.drills`, and schedules its next look
with a countdown, so no worker is held while a drill waits for its step or its recovery. A
database that does not answer is retried with backoff (both are idempotent: the launcher
answers a key once, a follow-up pass only adds what is new)."""

from __future__ import annotations

from celery import Task
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

from app.core.config import get_settings
from app.drills import dispatch
from app.drills.figures import finish_drill, request_figures
from app.drills.follow import awaiting_figures, follow_drill
from app.drills.launcher import HookSetup, Next, ask_launcher
from app.drills.service import get_drill
from app.models import utcnow
from app.tasks.celery_app import celery_app
from app.tasks.recovery_tasks import _engine

# How long one ask of the launcher waits for its answer before the task asks again later.
HOOK_WAIT_SECONDS = 5.0
ASK_AGAIN_SECONDS = 2.0


@celery_app.task(  # type: ignore[untyped-decorator]
    bind=True,
    name=dispatch.INJECT_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=8,
)
def inject(self: Task, drill_id: int) -> str:
    settings = get_settings()
    nxt = ask_launcher(_engine(), drill_id, _hook_setup(), now=utcnow())
    if nxt is Next.ASK_AGAIN:  # armed for its step: the same key is asked again later
        with Session(_engine()) as session:
            node = get_drill(session, drill_id).node
        dispatch.send_injection(celery_app, drill_id, node, countdown=ASK_AGAIN_SECONDS)
    elif nxt is Next.FOLLOW:
        dispatch.send_follow(
            celery_app, drill_id, countdown=settings.drills.follow_interval_seconds
        )
    return nxt.value


@celery_app.task(  # type: ignore[untyped-decorator]
    bind=True,
    name=dispatch.FOLLOW_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=8,
)
def follow(self: Task, drill_id: int) -> bool:
    settings = get_settings()
    with Session(_engine(), expire_on_commit=False) as session:
        done = follow_drill(session, drill_id, now=utcnow(), settings=settings)
        session.commit()
    if not done:
        dispatch.send_follow(
            celery_app, drill_id, countdown=settings.drills.follow_interval_seconds
        )
        return done
    with Session(_engine()) as session:
        node = awaiting_figures(session, drill_id)
    if node is not None:  # over: its node counts the generations redone and ends it
        request_figures(celery_app, _engine(), drill_id, node, now=utcnow())
    return done


@celery_app.task(  # type: ignore[untyped-decorator]
    bind=True,
    name=dispatch.FIGURES_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    autoretry_for=(OperationalError,),
    retry_backoff=True,
    max_retries=8,
)
def figures(self: Task, drill_id: int) -> bool:
    return finish_drill(_engine(), drill_id, _hook_setup(), now=utcnow())


def _hook_setup() -> HookSetup:
    settings = get_settings()
    return HookSetup(
        settings.recovery.launcher, HOOK_WAIT_SECONDS, settings.drills.arm_timeout_seconds
    )
