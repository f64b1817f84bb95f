"""Helpers for the Ray integration's tests: the local cluster's addresses, actor pids, the
environment of a subprocess that imports the tests' actors, the whole product watching a job on
the local Ray."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.cli.demo import NODE, DemoStack
from integrations.ray.hook import write_hook
from tests.harness import free_port, wait_for


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


@contextmanager
def ray_stack(
    workdir: Path,
    ray_: LocalRay,
    job: str,
    preset: dict[str, Any],
    verl_log: Path,
    *,
    demo_job: str = "demo-idle",
) -> Iterator[DemoStack]:
    """The real server (policy engine, embedded Celery worker whose launcher hook is the Ray
    hook, read per action) and a real ``rlguard agent --ray`` mapping the actors of ``job`` by
    ``preset``, its step from verl's file-logger lines at ``verl_log`` (Ray knows none)."""
    s = DemoStack(workdir / "stack", free_port(), job=demo_job, schedule=None)
    try:
        s.start_server()
        preset_file = workdir / "preset.json"
        preset_file.write_text(json.dumps(preset))
        write_hook(s.workdir / "launcher-hook", [
            "--dashboard", ray_.dashboard, "--ray-address", ray_.gcs_address,
            "--preset", str(preset_file), "--ray-job", job, "--state-dir", str(workdir / "ray-hook"),
        ])  # fmt: skip
        s._spawn("agent", [
            sys.executable, "-m", "agents", "--server", s.url,
            "--token-file", str(s.workdir / "node.token"), "--node", NODE,
            "--run-dir", str(s.run_dir), "--interval", "0.5", "--simulate-gpus", "2",
            "--spool-dir", str(s.workdir / "spool"), "--log-level", "WARNING",
            "--ray", ray_.dashboard, "--ray-preset", str(preset_file), "--ray-job", job,
            "--verl-log", str(verl_log),
        ])  # fmt: skip
        yield s
    finally:
        s.stop()
