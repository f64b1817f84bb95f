"""The Ray hook's ``inject_fault`` (rlguard drill on a Ray job) against a real local Ray: kill
and hang signal the participant's actor process (Ray restarts a killed one), once per key; a
dry run signals nothing; oom, disk-full and --at-step are refused with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from integrations.ray.state import RayStateReader
from tests.harness import wait_for
from tests.integration.ray._ray import LocalRay, actor_pid, env_for_subprocess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
JOB = "verl-drill"


def _inject(
    ray_: LocalRay, state_dir: Path, key: str, rank: int = 5, **extra: object
) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "integrations.ray.hook",
        "inject_fault",
        f"--job={JOB}",
        "--role=rollout",
        f"--rank={rank}",
        f"--idempotency-key={key}",
        f"--extra={json.dumps(extra)}",
        "--wait=5",
        "--dashboard",
        ray_.dashboard,
        "--ray-address",
        ray_.gcs_address,
        "--state-dir",
        str(state_dir),
        "--preset",
        "verl",
        "--ray-job",
        JOB,
        "--timeout",
        "60",
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=env_for_subprocess(), check=False
    )


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_kill_and_hang_signal_the_actor_and_the_rest_is_refused(
    local_ray: LocalRay, tmp_path: Path
) -> None:
    import ray

    from tests.integration.ray.actors import vLLMHttpServer

    # Rank 5: the session's Ray keeps other tests' actors (dead ones too), none of them rollout-5.
    rollout = vLLMHttpServer.options(name="vllm_server_5_0", max_restarts=3).remote()
    pid = actor_pid(rollout)
    for extra, why in (
        ({"fault": "oom"}, "cannot inject 'oom' into an actor"),
        ({"fault": "disk-full"}, "cannot inject 'disk-full'"),
        ({"fault": "kill", "at_step": 5}, "cannot wait for a step"),
    ):
        r = _inject(local_ray, tmp_path, "refused", **extra)
        assert r.returncode == 1 and why in r.stderr, r.stderr
    plan = _inject(local_ray, tmp_path, "plan", fault="kill", dry_run=True)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["what"].startswith(
        f"SIGKILL rollout-5 (Ray actor vllm_server_5_0, pid {pid})"
    )
    assert actor_pid(rollout) == pid and _state(pid) != "T"

    killed = _inject(local_ray, tmp_path, "drill-1", fault="kill")
    assert killed.returncode == 0, killed.stderr
    answer = json.loads(killed.stdout)
    assert answer["ok"] is True and answer["target_pid"] == pid and answer["already"] is False

    def restarted() -> bool:
        return any(
            a.name == "vllm_server_5_0" and a.state == "ALIVE" and a.num_restarts == 1
            for a in RayStateReader(local_ray.dashboard).snapshot().actors
        )

    wait_for(restarted, 60, "Ray to restart the killed actor")
    after = actor_pid(rollout)
    again = _inject(local_ray, tmp_path, "drill-1", fault="kill")
    assert json.loads(again.stdout)["already"] is True and actor_pid(rollout) == after

    hung = _inject(local_ray, tmp_path, "drill-2", fault="hang")
    assert hung.returncode == 0, hung.stderr
    assert _state(after) == "T"
    ray.kill(rollout, no_restart=True)
