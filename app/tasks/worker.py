"""Running a recovery worker: ``rlguard worker [--node NODE]`` and the embedded one of ``up``."""

from __future__ import annotations

import socket
import sys

from app.core.child_processes import ChildSpec, exit_with_parent
from app.core.config import Settings
from app.policy.plans import CLUSTER_QUEUE

_NODE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def check_node_name(node: str) -> str:
    if not node or len(node) > 128 or not set(node) <= _NODE_NAME_CHARS:
        raise ValueError(
            f"bad node name {node!r}: use letters, digits, '.', '_' or '-' (at most 128)"
        )
    return node


def queues_for(nodes: list[str], *, cluster: bool) -> list[str]:
    qs = [CLUSTER_QUEUE] if cluster else []
    return qs + [f"node.{check_node_name(n)}" for n in nodes]


def worker_argv(
    queues: list[str], *, name: str, concurrency: int = 1, loglevel: str = "INFO"
) -> list[str]:
    return [
        "worker",
        "-Q",
        ",".join(queues),
        "-n",
        f"{name}@%h",
        "--concurrency",
        str(concurrency),
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        loglevel,
    ]


def run_worker(
    queues: list[str], *, name: str, concurrency: int = 1, loglevel: str = "INFO"
) -> None:
    from app.tasks.celery_app import celery_app

    exit_with_parent()  # the embedded worker of `rlguard up` stops when `up` dies, even by SIGKILL
    celery_app.worker_main(
        worker_argv(queues, name=name, concurrency=concurrency, loglevel=loglevel)
    )


def embedded_worker_spec(settings: Settings) -> ChildSpec:
    """The worker ``rlguard up`` runs beside the server: the cluster queue plus local nodes."""
    recovery = settings.recovery
    nodes = [
        n.strip() for n in (recovery.embedded_nodes or socket.gethostname()).split(",") if n.strip()
    ]
    argv = [sys.executable, "-m", "app.tasks", "--embedded", *[f"--node={n}" for n in nodes]]
    return ChildSpec(name="worker", argv=argv)
