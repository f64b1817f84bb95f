"""Settings of the recovery workers and the scheduler (``RLGUARD_RECOVERY_*``).

They live beside the tasks rather than in ``app.core.config`` so the worker side can grow
without touching the server's settings; the data directory and broker URL still come from there.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class RecoverySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RLGUARD_RECOVERY_", extra="ignore")

    # Where a job's run directory is: <run_root>/<job>. Default: <data_dir>/runs.
    run_root: Path | None = None
    # Executable called for restart_role / restart_job / reschedule_batches / restores:
    # ``<launcher> <action> --job J [--node N] [--role R] [--rank K] [--extra JSON]``.
    launcher: str | None = None
    launcher_timeout: Annotated[float, Field(gt=0)] = 120.0
    # Policy file (default: the shipped app/policy/policy.yaml).
    policy_file: Path | None = None
    # A worker holds an action this long; the task's hard time limit stays below it.
    action_lease_seconds: Annotated[float, Field(ge=5)] = 180.0
    max_attempts: Annotated[int, Field(ge=1)] = 5
    # The outbox re-sends an action not started this long after it was sent.
    redispatch_after_seconds: Annotated[float, Field(gt=0)] = 30.0
    dispatch_interval_seconds: Annotated[float, Field(gt=0)] = 2.0
    # Redis broker: an unacknowledged task comes back after this (above the longest task).
    visibility_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    broker_timeout_seconds: Annotated[float, Field(gt=0)] = 3.0
    # Scheduler lease (only one server replica runs the policy tick and the dispatcher).
    lease_seconds: Annotated[float, Field(gt=0)] = 10.0
    retention_days: Annotated[float, Field(gt=0)] = 90.0
    # Queues the embedded worker of `rlguard up` consumes besides `cluster` (comma separated
    # node names; default: this machine's host name).
    embedded_nodes: str | None = None

    @property
    def task_time_limit(self) -> float:
        """Hard limit of one task run: well inside the lease, so a stuck task is killed before
        another worker may take its action over."""
        return self.action_lease_seconds * 0.8


@lru_cache(maxsize=1)
def get_recovery_settings() -> RecoverySettings:
    return RecoverySettings()
