"""A Ray job under the whole product (real server, policy engine, Celery worker, agent, local Ray).

* kill -9 of a rollout actor's worker process -> the agent (--ray, --verl-log) reports it
  RAY_RESTARTING with Ray's death cause -> heartbeat_lost at once (medium: verl's log says the
  job is past its first steps) -> restart_role through the Ray hook, which leaves the restart to
  Ray -> the actor is ALIVE again with a new pid and the participant RUNNING.

A driver's crash, its approval and the resubmission through the Jobs API are
test_reference_job_resubmitted_by_rlguard.py's (the reference job, resumed bit for bit).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli.demo import DemoStack
from tests.harness import wait_for
from tests.integration.ray._ray import LocalRay, actor_pid, ray_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
JOB = "verl-grpo"


def verl_file_logger_lines(path: Path, steps: range) -> None:
    """What verl's FileLogger writes (verl/utils/tracking.py at b178a3cd: one
    ``orjson.dumps({"step": step, "data": data})`` line per step, file opened "wb")."""
    with open(path, "wb", buffering=0) as fp:
        for step in steps:
            data = {
                "perf/throughput": 1000.0 + step,
                "timing_s/gen": 3.0,
                "timing_s/update_actor": 1.0,
            }
            fp.write(orjson.dumps({"step": step, "data": data}) + b"\n")


# verl's rollout class, restricted to the actor names of these tests: the session's Ray also holds
# the actors other tests left (dead ones too), and --ray-job puts every mapped actor in this job.
PRESET = {
    "name": "verl-e2e",
    "resume": ["trainer.resume_mode=auto"],
    "roles": [
        {
            "role": "rollout",
            "class": "^vLLMHttpServer$",
            "name": r"^e2e_vllm_server_(?P<rank>\d+)_",
        },
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, local_ray: LocalRay) -> Iterator[DemoStack]:
    workdir = tmp_path_factory.mktemp("ray-stack")
    verl_log = workdir / "verl.jsonl"
    verl_file_logger_lines(verl_log, range(1, 13))
    with ray_stack(workdir, local_ray, JOB, PRESET, verl_log, demo_job=JOB) as s:
        yield s


def _incident(stack: DemoStack) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["kind"] == "heartbeat_lost" and inc["subject"].get("job") == JOB:
            return stack.incident(inc["id"])
    return None


def _phase(stack: DemoStack) -> dict[str, int]:
    for job in stack.api("GET", "/api/v1/jobs").json()["data"]:
        if job["name"] == JOB:
            return dict(job["phases"])
    return {}


def test_killed_rollout_actor_is_an_incident_with_rays_cause_and_ray_restarts_it(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path
) -> None:
    import ray

    from tests.integration.ray.actors import vLLMHttpServer

    gate = tmp_path / "gate"
    rollout = vLLMHttpServer.options(name="e2e_vllm_server_0_0", max_restarts=1).remote(str(gate))
    pid = actor_pid(rollout)
    logs = stack.workdir / "logs"
    try:
        wait_for(lambda: _phase(stack).get("RUNNING") == 1, 60, "the server to see the actor")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        inc = wait_for(lambda: _incident(stack), 60, "a heartbeat_lost incident")
        detect_s = time.monotonic() - killed
        assert inc["tier"] == "medium", json.dumps(inc)[:2000]
        assert inc["subject"]["role"] == "rollout" and str(inc["subject"]["rank"]) == "0"
        text = json.dumps(inc)
        assert "RESTARTING in Ray" in text and "Ray death cause" in text, text[:3000]

        def restarted() -> str | None:
            acts = [
                a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"
            ]
            return (
                acts[0]["status"] if acts and acts[0]["status"] in ("succeeded", "failed") else None
            )

        status = wait_for(restarted, 90, "restart_role to finish")
        server_log = (logs / "server.log").read_text(errors="replace")[-3000:]
        assert status == "succeeded", server_log
        action = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"][
            0
        ]
        assert "restarted_by" in json.dumps(action)  # the hook left the restart to Ray
        gate.touch()  # let Ray's restart finish
        wait_for(lambda: _phase(stack).get("RUNNING") == 1, 60, "the actor to run again")
        assert actor_pid(rollout) != pid
        print(f"kill -9 -> incident in {detect_s:.1f} s (loaded machine)")
    finally:
        gate.touch()
        ray.kill(rollout, no_restart=True)
