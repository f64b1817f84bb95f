"""Hand a drill to the Celery worker of the node that runs its process.

The same channel RLGuard's recovery actions take to a launcher: the node's queue
(``node.<node>``), whose worker runs the launcher hook (``RLGUARD_RECOVERY_LAUNCHER``). The
follow-up runs on the cluster queue: it reads the database only. The Celery app is the
caller's (the server's, or the worker's own), as the outbox takes it.
"""

from __future__ import annotations

from celery import Celery

from app.policy.plans import CLUSTER_QUEUE

INJECT_TASK = "drills.inject"
FOLLOW_TASK = "drills.follow"
FIGURES_TASK = "drills.figures"


def node_queue(node: str) -> str:
    return f"node.{node}"


def send_injection(celery: Celery, drill_id: int, node: str, *, countdown: float = 0.0) -> None:
    """Send the drill to its node's worker (after the row is committed). Raises whatever the
    broker raises when it cannot take the message (the caller marks the drill refused)."""
    celery.send_task(
        INJECT_TASK,
        args=[drill_id],
        queue=node_queue(node),
        countdown=countdown or None,
        retry=False,
    )


def send_follow(celery: Celery, drill_id: int, *, countdown: float) -> None:
    """Look at the drill again in ``countdown`` seconds (from a worker)."""
    celery.send_task(
        FOLLOW_TASK, args=[drill_id], queue=CLUSTER_QUEUE, countdown=countdown, retry=False
    )


def send_figures(celery: Celery, drill_id: int, node: str) -> None:
    """Count the drill's generations redone on its node and end it (from the follow-up)."""
    celery.send_task(FIGURES_TASK, args=[drill_id], queue=node_queue(node), retry=False)
