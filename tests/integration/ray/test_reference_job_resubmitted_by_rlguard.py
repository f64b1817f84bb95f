"""The reference job in Ray mode, submitted through the Ray Jobs API, resubmitted by RLGuard.

``python -m workload.launch --ray --ray-address GCS --ray-restart-by none --resume disable
--rollouts 1`` is submitted with ``JobSubmissionClient`` on the session's local Ray, as verl's
``main_ppo`` is; the real server (policy engine, embedded Celery worker whose launcher hook is
the Ray hook) and a real ``rlguard agent --ray`` watch it. kill -9 of the driver once the server
knows step 2 and its checkpoint is sealed -> the Ray job FAILED, its actors DEAD (OWNER_DIED) ->
heartbeat_lost for the trainer and for the rollout, two incidents ->
restart_role refused by the hook (no restarter: Ray cannot bring them back) -> each escalated to
heavy: SAFE_MODE, and one restart_job waiting for an approver (the second incident's is covered
by the first's: one person asked once for one whole-job restart) -> approved through the REST API -> the
hook resubmits through the Jobs API with the recorded entrypoint plus the reference preset's
``--resume=auto`` (replacing ``--resume disable``, which would refuse the run directory) and
releases the job's SAFE_MODE -> the new driver resumes from the checkpoint and the WAL (not from
step 0) and completes with final parameters bit-identical to a clean run under the process
supervisor, every consumed batch byte-identical. A second delivery of the same restart_job
submits nothing: the Jobs API lists exactly one new submission.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.demo import DemoStack
from tests.harness import wait_for
from tests.integration.ray._ray import LocalRay, ray_stack
from tests.integration.workload._jobs import ROOT, Job, consumed
from workload.job import RunDir, read_events, read_json
from workload.ray_mode import rlguard_preset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]
JOB = "ref-resubmit"
STEPS = 6
# The driver dies once the server knows the job is at this step (past the policy's first-step
# rule, so the incident starts medium) and its checkpoint is sealed: steps are left to resume.
KILL_AT = 2
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def _incidents(stack: DemoStack) -> list[dict[str, Any]]:
    """This job's incidents, whole (timeline and actions)."""
    return [stack.incident(i["id"]) for i in stack.incidents() if i["subject"].get("job") == JOB]


@pytest.fixture
def stack(tmp_path: Path, local_ray: LocalRay) -> Iterator[DemoStack]:
    with ray_stack(tmp_path, local_ray, JOB, rlguard_preset(JOB), tmp_path / "verl.jsonl") as s:
        yield s


def _mine(client: Any) -> list[Any]:
    """This job's Jobs API submissions, oldest first."""
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get("rlguard_job") == JOB]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def _action(stack: DemoStack, name: str) -> dict[str, Any] | None:
    """The job's action ``name`` once it finished (of whichever incident planned it)."""
    for inc in _incidents(stack):
        for a in inc["actions"]:
            if a["action"] == name and a["status"] in ("succeeded", "failed"):
                return a
    return None


def _one_restart_asked(stack: DemoStack) -> dict[str, Any] | None:
    """The job's one pending approval, once both lost participants' incidents are heavy and the
    later one's restart_job is covered by the earlier one's (not asked for again)."""
    incidents = _incidents(stack)
    roles = sorted(i["subject"].get("role") for i in incidents if i["tier"] == "heavy")
    covered = [e for i in incidents for e in i["timeline"] if e["type"] == "action_covered"]
    if roles != ["rollout", "trainer"] or not covered:
        return None
    mine = {i["id"] for i in incidents}
    pending = [a for a in stack.pending_approvals() if a["incident_id"] in mine]
    assert len(pending) == 1, pending  # never one approval per lost participant
    assert covered[0]["detail"]["covered_by_incident"] == pending[0]["incident_id"], covered
    return pending[0]


def test_driver_crash_is_approved_and_resubmitted_through_the_jobs_api_resuming_bit_for_bit(
    stack: DemoStack, local_ray: LocalRay, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(local_ray.dashboard)
    run = RunDir(
        stack.run_root / JOB
    )  # in the recovery worker's run root: SAFE_MODE's control file
    clean = Job(tmp_path / "clean", STEPS, "--rollouts", "1")
    first = client.submit_job(
        entrypoint=shlex.join(
            [
                sys.executable,
                "-m",
                "workload.launch",
                "--run-dir",
                str(run.root),
                "--steps",
                str(STEPS),
                "--rollouts",
                "1",
                "--decode-ms",
                "5.0",
                "--timeout",
                "200",
                "--ray",
                "--ray-address",
                local_ray.gcs_address,
                "--ray-restart-by",
                "none",
                "--resume",
                "disable",
            ]
        ),  # fmt: skip
        runtime_env={
            "env_vars": {
                "PYTHONPATH": str(ROOT),
                "VERL_FILE_LOGGER_PATH": str(tmp_path / "verl.jsonl"),
            }
        },
        metadata={"rlguard_job": JOB},
    )

    def logs() -> str:
        return "\n".join(
            f"--- {j.submission_id} {j.status}\n{client.get_job_logs(j.submission_id)[-1500:]}"
            for j in _mine(client)
        )

    def events(kind: str) -> list[dict[str, Any]]:
        return [e for e in read_events(run) if e["kind"] == kind] if run.root.exists() else []

    try:

        def at_kill_step() -> bool:
            if client.get_job_status(first).value in ENDED:
                pytest.fail(f"the job ended before the kill:\n{logs()}")
            seen = stack.api("GET", f"/api/v1/jobs/{JOB}")
            if seen.status_code != 200:
                return False  # the agent has not reported the job yet
            steps = [p["step"] for p in seen.json()["participant_list"] if p["role"] == "trainer"]
            sealed = any(e["step"] >= KILL_AT for e in events("checkpoint"))
            return bool(steps) and steps[0] >= KILL_AT and sealed

        # From the submission: Ray sets up the runtime env and starts the job's actors first,
        # which took more than 60 s once on the 2-core host with other tests running beside it.
        wait_for(at_kill_step, 150, f"the server to see step {KILL_AT}", context=logs)
        os.kill(int((read_json(run.runtime) or {})["launcher_pid"]), signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: client.get_job_status(first).value == "FAILED", 30, "the Ray job to fail")

        pending = [
            wait_for(
                lambda: _one_restart_asked(stack),
                60,
                "one restart_job waiting for an approver",
                context=logs,
            )
        ]
        assert [x["action"] for x in pending[0]["actions"]] == ["restart_job"], pending
        asked = time.monotonic()
        refused = _action(stack, "restart_role")
        assert refused is not None and refused["status"] == "failed", refused
        assert "restart_job" in json.dumps(refused)  # the hook's reason says what is needed
        assert (
            wait_for(lambda: _action(stack, "enter_safe_mode"), 30, "SAFE_MODE")["status"]
            == "succeeded"
        )
        assert json.loads((run.root / "control.json").read_text())["mode"] == "safe_mode"
        assert len(_mine(client)) == 1  # nothing resubmitted before the approval
        r = stack.api(
            "POST", f"/api/v1/approvals/{pending[0]['id']}/approve", json={"comment": "go"}
        )
        assert r.status_code == 200, r.text
        approved = time.monotonic()

        action = wait_for(lambda: _action(stack, "restart_job"), 60, "restart_job", context=logs)
        assert action["status"] == "succeeded", json.dumps(action)[:2000]
        done = json.loads(action["result"]["stdout"])
        assert done["stopped"] == first and done["already"] is False, done
        assert shlex.split(done["entrypoint"])[-1] == "--resume=auto", done
        assert "--resume" not in shlex.split(done["entrypoint"])[:-1], done  # replaced, not added
        # The approved restart is the job's release: the new driver does not start held.
        assert done["released_safe_mode"] is True, done
        assert json.loads((run.root / "control.json").read_text())["mode"] == "run"
        resubmitted = time.monotonic()
        # A second delivery of the same action submits nothing.
        again = subprocess.run(
            [str(stack.workdir / "launcher-hook"), "restart_job", "--job", JOB,
             "--idempotency-key", action["idempotency_key"]],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)["already"] is True
        assert [j.submission_id for j in _mine(client)] == [first, done["submitted"]]

        wait_for(
            lambda: client.get_job_status(done["submitted"]).value in ENDED,
            120,
            "the resubmitted job to end",
            context=logs,
        )
        assert client.get_job_status(done["submitted"]).value == "SUCCEEDED", logs()
        ended = time.monotonic()
        final_clean = clean.finish()
    finally:
        for j in _mine(client):
            if j.status not in ENDED:
                client.stop_job(j.submission_id)
        clean.close()
    final_ray = read_json(run.final) or {}
    assert final_ray["step"] == final_clean["step"] == STEPS
    assert final_ray["params_sha256"] == final_clean["params_sha256"]
    assert consumed(run) == consumed(clean)
    starts = [e["step"] for e in events("trainer_start")]
    assert starts[0] == 0 and len(starts) == 2 and starts[1] >= KILL_AT, (
        starts
    )  # resumed, not from 0
    assert len(_mine(client)) == 2
    print(
        f"kill -> approval asked {asked - killed:.1f} s; approved -> resubmitted "
        f"{resubmitted - approved:.1f} s; -> resumed job done {ended - resubmitted:.1f} s "
        f"(loaded machine)"
    )
