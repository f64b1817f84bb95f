"""What tests share: real RLGuard processes (server, agent, Celery worker) that cannot outlive
the pytest run, PostgreSQL and Redis, in-process apps, the policy stack, and one ``wait_for``.

Conftests only define fixtures; they import what they need from here.
"""

from tests.harness.apps import Api, AppClient, auth, batch, make_settings
from tests.harness.processes import (
    REPO,
    RLGUARD,
    AgentProcess,
    ServerProcess,
    rlguard_env,
    run_cli,
    start_worker,
)
from tests.harness.reaper import kill_group, spawn
from tests.harness.services import RedisServer, free_port, refusing_port
from tests.harness.waiting import wait_for

__all__ = [
    "REPO",
    "RLGUARD",
    "AgentProcess",
    "Api",
    "AppClient",
    "RedisServer",
    "ServerProcess",
    "auth",
    "batch",
    "free_port",
    "refusing_port",
    "kill_group",
    "make_settings",
    "rlguard_env",
    "run_cli",
    "spawn",
    "start_worker",
    "wait_for",
]
