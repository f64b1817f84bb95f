"""A real local Ray cluster for the Ray integration's tests (CPU only, kept small).

One cluster per test session, started in this process with ``ray.init`` (this process is its
first driver and owns it; ``ray.shutdown`` at the end stops every process it started). The
dashboard is on: it serves the state API and the Jobs API that the collector and the hook use.
A missing ``ray`` fails loudly: the ``ray`` extra is installed by ``scripts/bootstrap.sh dev``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import free_port


@dataclass(frozen=True)
class LocalRay:
    gcs_address: str
    dashboard: str  # http://127.0.0.1:PORT
    temp_dir: str


def wait_for(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``pred`` every 0.1 s until it returns something true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


def _wait_for_job_agent(dashboard: str) -> None:
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
    wait_for(lambda: client.get_job_status(probe).value in ("SUCCEEDED", "FAILED", "STOPPED"),
             60, "the probe job to end")


@pytest.fixture(scope="session")
def local_ray() -> Iterator[LocalRay]:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the dev install has it
        pytest.fail(f"the ray extra is required (scripts/bootstrap.sh dev): {exc}")
    # A short private temp dir: Ray's socket paths must stay under the Unix 107-byte limit.
    temp_dir = tempfile.mkdtemp(prefix="rlgray-", dir="/tmp")
    port = free_port()
    # The workers import the tests' actor classes: they inherit PYTHONPATH from this process.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = env_for_subprocess()["PYTHONPATH"]
    ctx = ray.init(
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=port,
        object_store_memory=80 * 1024 * 1024,
        logging_level="ERROR",
        log_to_driver=False,
        namespace="rlguard-test",
        _temp_dir=temp_dir,
        # A node whose raylet stops answering is declared dead after ~1.5 s instead of ~15 s.
        _system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    )
    try:
        dashboard = f"http://127.0.0.1:{port}"
        _wait_for_job_agent(dashboard)
        yield LocalRay(
            gcs_address=ctx.address_info["gcs_address"], dashboard=dashboard, temp_dir=temp_dir
        )
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def actor_pid(handle: Any) -> int:
    import ray

    return int(ray.get(handle.pid.remote(), timeout=30))


def env_for_subprocess() -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env
