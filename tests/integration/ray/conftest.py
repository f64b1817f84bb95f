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
from collections.abc import Iterator

import pytest

from tests.harness import free_port
from tests.integration.ray._ray import LocalRay, env_for_subprocess, wait_for_job_agent


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
        wait_for_job_agent(dashboard)
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
