"""Helpers for the Ray integration's tests: the local cluster's addresses, actor pids, the
environment of a subprocess that imports the tests' actors."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tests.harness import wait_for


@dataclass(frozen=True)
class LocalRay:
    gcs_address: str
    dashboard: str  # http://127.0.0.1:PORT
    temp_dir: str


def wait_for_job_agent(dashboard: str) -> None:
    """Until the head's job agent has registered, the Jobs API answers every submission with
    "No available agent" (seen on a loaded machine): submit a no-op job until one is taken."""
    from ray.job_submission import JobSubmissionClient

    from integrations.ray.hook import NO_JOB_AGENT

    client = JobSubmissionClient(dashboard)

    def submitted() -> str | None:
        try:
            # Named, so that no hook ever takes it for "the one unnamed job of the cluster".
            return str(client.submit_job(entrypoint="true", metadata={"rlguard_job": "probe"}))
        except RuntimeError as exc:
            if NO_JOB_AGENT not in str(exc):
                raise
            return None

    probe = wait_for(submitted, 120, "the Ray Jobs API to take a submission")
    wait_for(
        lambda: client.get_job_status(probe).value in ("SUCCEEDED", "FAILED", "STOPPED"),
        60,
        "the probe job to end",
    )


def actor_pid(handle: Any) -> int:
    import ray

    return int(ray.get(handle.pid.remote(), timeout=30))


def env_for_subprocess() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env
