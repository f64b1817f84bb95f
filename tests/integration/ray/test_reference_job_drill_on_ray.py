"""``rlguard drill`` on the reference job in Ray mode, through the whole product: the real server
(policy engine, embedded Celery worker whose launcher hook is the Ray hook), a real ``rlguard
agent --ray`` and ``python -m workload.launch --ray --ray-restart-by rlguard`` on the session's
local Ray. A fault the Ray hook cannot inject (oom) is one line naming it, nothing injected; a
kill drill of the rollout actor is injected by the Ray hook (SIGKILL of the actor's worker
process), detected (heartbeat_lost), healed by RLGuard's restart_role through the job's
restarter, reported with its figures and marked as a drill, with the generations redone the Ray hook
counted in the job's run directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from recovery.report import heartbeat_path
from tests.harness import rlguard_env, run_cli, wait_for
from tests.integration.ray._ray import LocalRay, ray_stack
from tests.integration.workload._jobs import Job
from workload.job import read_json
from workload.ray_mode import rlguard_preset

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
JOB = "ref-drill-ray"
STEPS = 400  # long enough to be running through the drill; closed by the test


@pytest.fixture
def stack(tmp_path: Path, local_ray: LocalRay) -> Iterator[DemoStack]:
    with ray_stack(tmp_path, local_ray, JOB, rlguard_preset(JOB), tmp_path / "verl.jsonl") as s:
        yield s


def _drill(stack: DemoStack, *args: str) -> Any:
    env = rlguard_env(
        None, stack.workdir / "data", RLGUARD_URL=stack.url, RLGUARD_TOKEN=stack.token
    )
    return run_cli("drill", "--job", JOB, *args, env=env, timeout=240)


def _server_step(stack: DemoStack, role: str) -> int:
    r = stack.api("GET", f"/api/v1/jobs/{JOB}")
    if r.status_code != 200:
        return -1
    return max((p["step"] for p in r.json()["participant_list"] if p["role"] == role), default=-1)


def test_a_kill_drill_of_a_rollout_actor_through_the_server(
    stack: DemoStack, local_ray: LocalRay, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    on_ray = Job(
        stack.run_root / JOB,
        STEPS,
        "--rollouts",
        "1",
        "--ray",
        "--ray-address",
        local_ray.gcs_address,
        "--ray-restart-by",
        "rlguard",
    )
    try:
        # Past the first step (a fault there is heavy), both roles known to the server.
        wait_for(
            lambda: _server_step(stack, "trainer") >= 3 and _server_step(stack, "rollout") >= 3,
            150,
            "the server to see step 3",
        )
        beat = read_json(heartbeat_path(on_ray.run.root, "rollout", 0)) or {}
        refused = _drill(stack, "--fault", "oom", "--role", "rollout", "--rank", "0")
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused.stderr
        assert "oom" in lines[0] and "nothing injected" in lines[0], lines
        r = _drill(stack, "--fault", "kill", "--role", "rollout", "--rank", "0", "--timeout", "200")
        assert r.returncode == 0, (r.stderr, r.stdout)
        print(r.stdout)  # the printed report, for whoever runs this with -s
        assert (
            f"kill rollout-0 of job {JOB}" in r.stdout and "recovered" in r.stdout.splitlines()[0]
        )
        drill_id = int(r.stdout.split(":")[0].split()[1])
        d = stack.api("GET", f"/api/v1/drills/{drill_id}").json()
        rep = d["report"]
        assert rep["incident"]["kind"] == "heartbeat_lost", rep
        assert rep["actions"][-1]["action"] == "restart_role", rep
        assert rep["actions"][-1]["status"] == "succeeded", rep
        assert 0 <= rep["detection_delay_seconds"] < rep["time_to_first_new_step_seconds"] < 200
        assert rep["counted_in_ettr"] is False
        # Counted by the Ray hook from the job's run directory (its rollout WAL's lost_rollout
        # events since the injection): the batch the killed actor was generating, if any.
        assert isinstance(rep["generations_redone"], int) and rep["generations_redone"] >= 0, rep
        assert rep["unit"] == "rollouts", rep
        inc = stack.incident(rep["incident"]["id"])
        assert [e for e in inc["timeline"] if e["type"] == "drill"], inc["timeline"]
        after = read_json(heartbeat_path(on_ray.run.root, "rollout", 0)) or {}
        assert after.get("pid") != beat.get("pid")  # a new actor process
    finally:
        on_ray.close()
