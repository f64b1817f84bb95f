"""A Ray job under the whole product (real server, policy engine, Celery worker, agent, local Ray).

* kill -9 of a rollout actor's worker process -> the agent (--ray, --verl-log) reports it
  RAY_RESTARTING with Ray's death cause -> heartbeat_lost at once (medium: verl's log says the
  job is past its first steps) -> restart_role through the Ray hook, which leaves the restart to
  Ray -> the actor is ALIVE again with a new pid and the participant RUNNING.
* kill -9 of the driver of a job submitted through the Jobs API -> its trainer actor is DEAD
  (OWNER_DIED) -> heartbeat_lost -> restart_role refused by the hook (twice) -> escalated to
  heavy: SAFE_MODE, restart_job waiting for an approver -> approved -> the job is resubmitted
  through the Jobs API with trainer.resume_mode=auto -> its new trainer runs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.cli.demo import NODE, DemoStack
from integrations.ray.hook import write_hook
from tests.harness import free_port, wait_for
from tests.integration.ray._ray import LocalRay, actor_pid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
JOB = "verl-grpo"


def verl_file_logger_lines(path: Path, steps: range) -> None:
    """What verl's FileLogger writes (verl/utils/tracking.py at b178a3cd: one
    ``orjson.dumps({"step": step, "data": data})`` line per step, file opened "wb")."""
    with open(path, "wb", buffering=0) as fp:
        for step in steps:
            data = {"perf/throughput": 1000.0 + step, "timing_s/gen": 3.0, "timing_s/update_actor": 1.0}
            fp.write(orjson.dumps({"step": step, "data": data}) + b"\n")


# verl's classes, restricted to the actor names of these tests: the session's Ray also holds the
# actors other tests left (dead ones too), and --ray-job puts every mapped actor in this job.
PRESET = {
    "name": "verl-e2e",
    "resume": ["trainer.resume_mode=auto"],
    "roles": [
        {"role": "rollout", "class": "^vLLMHttpServer$", "name": r"^e2e_vllm_server_(?P<rank>\d+)_"},
        {"role": "trainer", "class": "^WorkerDict$", "name": r"^drvWorkerDict_(?P<group>\d+):(?P<local>\d+)$"},
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, local_ray: LocalRay) -> Iterator[DemoStack]:
    tmp_path = tmp_path_factory.mktemp("ray-stack")
    s = DemoStack(tmp_path, free_port(), job=JOB, schedule=None)
    try:
        s.start_server()
        # The recovery worker's launcher hook is the Ray hook for this node's jobs.
        preset = tmp_path / "preset.json"
        preset.write_text(json.dumps(PRESET))
        write_hook(s.workdir / "launcher-hook", [
            "--dashboard", local_ray.dashboard, "--ray-address", local_ray.gcs_address,
            "--preset", str(preset), "--ray-job", JOB, "--state-dir", str(tmp_path / "ray-hook"),
        ])
        verl_log = tmp_path / "verl.jsonl"
        verl_file_logger_lines(verl_log, range(1, 13))
        s._spawn("agent", [
            sys.executable, "-m", "agents", "--server", s.url,
            "--token-file", str(s.workdir / "node.token"), "--node", NODE,
            "--run-dir", str(s.run_dir), "--interval", "0.5", "--simulate-gpus", "2",
            "--spool-dir", str(s.workdir / "spool"), "--log-level", "WARNING",
            "--ray", local_ray.dashboard, "--ray-preset", str(preset), "--ray-job", JOB,
            "--verl-log", str(verl_log),
        ])
        yield s
    finally:
        s.stop()


def _incident(stack: DemoStack) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["kind"] == "heartbeat_lost" and inc["subject"].get("job") == JOB:
            return stack.incident(inc["id"])
    return None


def _status(stack: DemoStack, inc: dict[str, Any], action: str) -> str | None:
    acts = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == action]
    done = [a["status"] for a in acts if a["status"] in ("succeeded", "failed")]
    return done[-1] if done else None


def _incident_of(stack: DemoStack, role: str) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["subject"].get("job") == JOB and inc["subject"].get("role") == role:
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
            acts = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"]
            return acts[0]["status"] if acts and acts[0]["status"] in ("succeeded", "failed") else None

        status = wait_for(restarted, 90, "restart_role to finish")
        server_log = (logs / "server.log").read_text(errors="replace")[-3000:]
        assert status == "succeeded", server_log
        action = [a for a in stack.incident(inc["id"])["actions"] if a["action"] == "restart_role"][0]
        assert "restarted_by" in json.dumps(action)  # the hook left the restart to Ray
        gate.touch()  # let Ray's restart finish
        wait_for(lambda: _phase(stack).get("RUNNING") == 1, 60, "the actor to run again")
        assert actor_pid(rollout) != pid
        print(f"kill -9 -> incident in {detect_s:.1f} s (loaded machine)")
    finally:
        gate.touch()
        ray.kill(rollout, no_restart=True)


def test_driver_crash_is_escalated_approved_and_resubmitted_with_resume(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    from tests.integration.ray._ray import env_for_subprocess

    client = JobSubmissionClient(local_ray.dashboard)
    starts, stop = tmp_path / "starts.jsonl", tmp_path / "stop"
    first = client.submit_job(
        entrypoint=f"{sys.executable} -m tests.integration.ray.driver --starts {starts} "
        f"--stop {stop} trainer.resume_mode=disable",
        runtime_env={"env_vars": {"PYTHONPATH": env_for_subprocess()["PYTHONPATH"]}},
        metadata={"rlguard_job": JOB},
    )
    try:
        def started() -> dict[str, Any] | None:
            if client.get_job_status(first).value in ("FAILED", "STOPPED"):
                pytest.fail(f"the driver ended: {client.get_job_logs(first)[-3000:]}")
            return json.loads(starts.read_text().splitlines()[0]) if starts.exists() else None

        start = wait_for(started, 90, "the driver to start its trainer")
        wait_for(lambda: _phase(stack).get("RUNNING", 0) >= 1, 60, "the server to see the trainer")
        os.kill(start["pid"], signal.SIGKILL)
        inc = wait_for(lambda: _incident_of(stack, "trainer"), 60, "an incident for the trainer")
        assert inc["kind"] == "heartbeat_lost" and "OWNER_DIED" in json.dumps(inc), json.dumps(inc)[:2000]
        heavy = wait_for(lambda: (i := _incident_of(stack, "trainer")) and i["tier"] == "heavy" and i,
                         120, "the escalation to heavy after restart_role was refused")
        restarts = [a for a in heavy["actions"] if a["action"] == "restart_role"]
        assert restarts and all(a["status"] == "failed" for a in restarts)
        assert "restart_job" in json.dumps(restarts)  # the hook's reason says what is needed
        pending = wait_for(lambda: [a for a in stack.pending_approvals() if a["incident_id"] == inc["id"]],
                           60, "the approval request for restart_job")
        assert wait_for(lambda: _status(stack, inc, "enter_safe_mode"), 60, "SAFE_MODE") == "succeeded"
        assert json.loads((stack.run_dir / "control.json").read_text())["mode"] == "safe_mode"
        assert not starts.read_text().splitlines()[1:]  # nothing resubmitted before approval
        r = stack.api("POST", f"/api/v1/approvals/{pending[0]['id']}/approve", json={"comment": "go"})
        assert r.status_code == 200, r.text
        assert wait_for(lambda: _status(stack, inc, "restart_job"), 90, "restart_job") == "succeeded"
        second = wait_for(lambda: starts.read_text().splitlines()[1:], 90, "the resubmitted driver")
        assert json.loads(second[0])["argv"] == ["trainer.resume_mode=auto"]
        assert client.get_job_status(first).value in ("FAILED", "STOPPED")
        wait_for(lambda: _phase(stack).get("RUNNING", 0) >= 1 and not _phase(stack).get("RAY_DEAD"),
                 60, "the resubmitted trainer to run")
    finally:
        stop.touch()
