"""The Slurm backend under the whole product, on the real Slurm of conftest.py: a batch job runs
``rlguard launch --backend slurm`` around a small training script (``_train.py``); the real
server with its policy engine and Celery worker (embedded ``rlguard up``) and a real node agent
(``--node`` the Slurm node, simulated GPUs: the fake NVML at the hardware boundary) watch it.

1. kill -9 of the rank in the job's first step -> the launcher writes EXITED -> heartbeat_lost,
   escalated to heavy (RobustRL's first-step anomaly): SAFE_MODE at once and restart_job
   waiting for an approver -> an approver approves through the REST API -> the Celery worker
   runs the launcher hook -> the launcher inside the job asks Slurm (``scontrol requeue``) ->
   the batch script runs again (``SLURM_RESTART_COUNT`` 1), the script resumes after step 1.
   A kill later in a job is a medium fault (restart_role: the launcher restarts the process in
   the same batch step, no requeue); the first-step case is the one that restarts the job.
2. A simulated XID 79 on GPU 1 (the fake NVML) -> the agent -> gpu_xid -> drain_node planned
   (``detection.gpu.drain_xids: [79]`` in this test's policy; the shipped policy drains
   nothing) and waiting for an approver: the node stays in service until approved -> approved
   -> ``scontrol show node`` says DRAIN with RLGuard's reason and the incident. The GPU that fell
   off the bus is also lost; that is the same root cause, so the same incident (no gpu_lost of
   its own): its plan's restart_role restarts the rank in place, inside the same batch run.
3. The job then finishes its work and Slurm records it COMPLETED (requeued once).

The reference job (``python -m workload.launch --backend slurm``: its own supervisor of trainer
and rollouts on the same Slurm backend) is requeued through RLGuard in the second test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.cli.demo import DemoStack
from recovery.report import heartbeat_path, read_heartbeat
from recovery.supervision.backends.slurm import node_is_lost
from recovery.supervision.events import read_events
from tests.harness import free_port, wait_for
from tests.integration.slurm._slurm import NODE, Slurm
from workload.job import RunDir, read_json
from workload.job import read_events as read_run_events

REPO = Path(__file__).resolve().parents[3]
TRAIN = Path(__file__).resolve().parent / "_train.py"
RLGUARD = Path(sys.executable).parent / "rlguard"
JOB = "grpo-slurm-e2e"

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]


class SlurmStack(DemoStack):
    """The demo stack with drains turned on for XID 79 in its policy file."""

    def _env(self) -> dict[str, str]:
        env = super()._env()
        shipped = Path(env["RLGUARD_RECOVERY_POLICY_FILE"])
        policy = yaml.safe_load(shipped.read_text(encoding="utf-8"))
        policy["detection"]["gpu"]["drain_xids"] = [79]
        path = self.workdir / "policy-drain.yaml"
        path.write_text(yaml.safe_dump(policy), encoding="utf-8")
        env["RLGUARD_RECOVERY_POLICY_FILE"] = str(path)
        return env


def _serving(s: DemoStack) -> Iterator[DemoStack]:
    """``s``'s server and node agent (the Slurm node) for one test."""
    try:
        s.start_server()
        s.start_agent()
        yield s
    finally:
        s.stop()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DemoStack]:
    yield from _serving(SlurmStack(tmp_path, free_port(), job=JOB, schedule=None, node=NODE))


def _approver_token(stack: DemoStack) -> str:
    from sqlmodel import Session

    from app.auth.users import create_user
    from app.core.db import make_engine
    from app.models import Role

    engine = make_engine(f"sqlite:///{stack.workdir / 'data' / 'rlguard.db'}")
    try:
        with Session(engine) as s:
            token = create_user(s, name="oncall", role=Role.approver, actor="system:test")[1]
            s.commit()
    finally:
        engine.dispose()
    return token


def _incident(stack: DemoStack, kind: str) -> dict[str, Any] | None:
    for inc in stack.incidents():
        if inc["kind"] == kind:
            return stack.incident(inc["id"])
    return None


def _action(stack: DemoStack, incident: dict[str, Any], name: str) -> dict[str, Any] | None:
    acts = [a for a in stack.incident(incident["id"])["actions"] if a["action"] == name]
    return acts[0] if acts else None


def _finished(stack: DemoStack, incident: dict[str, Any], name: str) -> str | None:
    act = _action(stack, incident, name)
    return act["status"] if act and act["status"] in ("succeeded", "failed") else None


def _pending_for(stack: DemoStack, incident: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in stack.pending_approvals() if a["incident_id"] == incident["id"]]


def _approve(stack: DemoStack, token: str, approval: dict[str, Any]) -> None:
    with httpx.Client(base_url=stack.url, timeout=10) as http:
        r = http.post(
            f"/api/v1/approvals/{approval['id']}/approve",
            json={"comment": "on call: go"},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert r.status_code == 200, r.text
    assert r.json()["decided_by"] == "oncall", r.json()


def _server_step(stack: DemoStack, job: str = JOB) -> int:
    r = stack.api("GET", f"/api/v1/jobs/{job}")
    if r.status_code != 200:
        return -1
    steps = [p["step"] for p in r.json()["participant_list"] if p["role"] == "trainer"]
    return max(steps, default=-1)


def _submit(slurm: Slurm, run_dir: Path, out: Path) -> str:
    return _sbatch(
        slurm,
        out,
        f"{RLGUARD} launch --job {JOB} --role trainer --rank 0 --run-dir {run_dir} "
        f"--backend slurm --backoff 0 -- {sys.executable} {TRAIN}",
    )


def _sbatch(slurm: Slurm, out: Path, command: str) -> str:
    """Submit ``command`` as a requeueable batch job; its id."""
    script = out / "job.sh"
    script.write_text(f"#!/bin/sh\nexec {command}\n")
    env = {k: v for k, v in slurm.env.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--requeue",
            f"--chdir={REPO}",
            f"--output={out}/slurm-%j.out",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_kill_then_requeue_and_xid_79_drain_through_rlguard_on_real_slurm(
    slurm: Slurm, stack: DemoStack, tmp_path: Path
) -> None:
    approver = _approver_token(stack)
    run_dir = stack.run_dir
    job = _submit(slurm, run_dir, tmp_path)
    starts = run_dir / "starts.jsonl"

    def logs() -> str:
        batch = "\n".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
        server = (stack.workdir / "logs" / "server.log").read_text(errors="replace")[-3000:]
        events = [e for e in read_events(run_dir / "events.jsonl") if e["kind"] != "fault"]
        incidents = [(i["id"], i["kind"], i["tier"], i["subject"]) for i in stack.incidents()]
        return (
            f"--- batch\n{batch}\n--- server\n{server}\n--- slurm job\n{slurm.job(job)}\n"
            f"--- launcher events\n{events}\n--- incidents\n{incidents}\n{slurm.logs()}"
        )

    def started() -> list[dict[str, Any]]:
        lines = starts.read_text().splitlines() if starts.exists() else []
        return [json.loads(line) for line in lines]

    try:
        first = wait_for(started, 60, "the script to start in the batch job", context=logs)[0]
        assert first["restarts"] == 0
        wait_for(lambda: _server_step(stack) == 1, 60, "the server to see step 1", context=logs)
        os.kill(first["pid"], signal.SIGKILL)

        # 1. heavy: SAFE_MODE at once; the requeue waits for an approver.
        inc = wait_for(
            lambda: _incident(stack, "heartbeat_lost"), 60, "heartbeat_lost", context=logs
        )
        assert inc["tier"] == "heavy" and inc["subject"]["job"] == JOB, inc
        pending = wait_for(
            lambda: _pending_for(stack, inc), 60, "the restart_job approval", context=logs
        )
        assert [a["action"] for a in pending[0]["actions"]] == ["restart_job"], pending
        assert (
            wait_for(
                lambda: _finished(stack, inc, "enter_safe_mode"), 30, "SAFE_MODE", context=logs
            )
            == "succeeded"
        )
        assert json.loads((run_dir / "control.json").read_text())["mode"] == "safe_mode"
        assert read_heartbeat(heartbeat_path(run_dir, "trainer", 0))["phase"] == "EXITED"
        assert slurm.job(job)["Restarts"] == "0" and len(started()) == 1  # nothing before approval

        _approve(stack, approver, pending[0])
        assert (
            wait_for(lambda: _finished(stack, inc, "restart_job"), 60, "restart_job", context=logs)
            == "succeeded"
        ), _action(stack, inc, "restart_job")
        second = wait_for(lambda: started()[1:], 60, "the requeued batch script", context=logs)[0]
        assert second["restarts"] == 1 and second["from_step"] == 1, second
        assert slurm.job(job)["Restarts"] == "1"

        # 2. XID 79 once the job is past its first steps (a fault there would be heavy).
        wait_for(lambda: _server_step(stack) >= 3, 60, "the resumed job to train", context=logs)
        assert not node_is_lost(slurm.node()["State"])
        subprocess.run(
            [
                sys.executable,
                "-m",
                "workload.chaos",
                "--run-dir",
                str(run_dir),
                "xid",
                "--gpu",
                "1",
                "--xid",
                "79",
            ],
            cwd=REPO,
            check=True,
            timeout=60,
            capture_output=True,
        )
        xid = wait_for(lambda: _incident(stack, "gpu_xid"), 60, "gpu_xid", context=logs)
        assert xid["tier"] == "medium" and xid["subject"]["node"] == NODE, xid
        drain = wait_for(
            lambda: _pending_for(stack, xid), 60, "the drain_node approval", context=logs
        )
        assert [a["action"] for a in drain[0]["actions"]] == ["drain_node"], drain
        assert not node_is_lost(slurm.node()["State"])  # nothing drained before approval

        _approve(stack, approver, drain[0])
        assert (
            wait_for(lambda: _finished(stack, xid, "drain_node"), 60, "drain_node", context=logs)
            == "succeeded"
        ), _action(stack, xid, "drain_node")
        node = slurm.node()
        assert "DRAIN" in node["State"], node
        assert node["Reason"].startswith(
            f"rlguard: gpu 1 XID 79 (GPU fallen off the bus) [incident {xid['id']}]"
        ), node

        # The fake NVML reports a GPU that fell off the bus as lost too: one root cause, so no
        # gpu_lost incident of its own; the XID incident's plan restarts the role in place (no
        # requeue: the same batch run, restart count 1).
        assert _incident(stack, "gpu_lost") is None
        assert (
            wait_for(
                lambda: _finished(stack, xid, "restart_role"), 60, "restart_role", context=logs
            )
            == "succeeded"
        ), _action(stack, xid, "restart_role")
        third = wait_for(lambda: started()[2:], 30, "the role restarted in place", context=logs)[0]
        assert third["restarts"] == 1 and third["from_step"] >= 3, third

        # 3. Running work finishes on a draining node: the job completes, requeued once.
        (run_dir / "stop").touch()
        wait_for(
            lambda: slurm.job(job)["JobState"] == "COMPLETED",
            60,
            "the job to complete",
            context=logs,
        )
        assert slurm.job(job)["Restarts"] == "1" and len(started()) == 3, logs()
        assert "DRAIN" in slurm.node()["State"]  # still out of service once the job left
    finally:
        (run_dir / "stop").touch()
        subprocess.run(["scancel", job], env=slurm.env, timeout=30, check=False)
        if node_is_lost(slurm.node()["State"]):  # leave the node in service for other tests
            slurm.scontrol("update", f"NodeName={NODE}", "State=RESUME")


def _submit_reference_job(slurm: Slurm, run_dir: Path, out: Path, steps: int) -> str:
    """The reference job (trainer + 2 rollouts, ``python -m workload.launch``) as a batch job,
    its supervisor on the Slurm backend. Its ``scontrol`` is slow to return from a requeue, as
    a loaded node's can be: Slurm stops the batch step, that scontrol with it, before it
    returns (seen once in CI; this makes it the case every time)."""
    bin_dir = out / "bin"
    bin_dir.mkdir()
    slow = bin_dir / "scontrol"
    slow.write_text(
        "#!/bin/sh\n"
        f'{shutil.which("scontrol")} "$@"; rc=$?\n'
        '[ "$1" = requeue ] && [ $rc = 0 ] && sleep 60\n'
        "exit $rc\n"
    )
    slow.chmod(0o755)
    return _sbatch(
        slurm,
        out,
        f"env PATH={bin_dir}:{os.environ['PATH']} {sys.executable} -m workload.launch "
        f"--backend slurm --run-dir {run_dir} --job {REF_JOB} --steps {steps} --rollouts 2 "
        "--decode-ms 5 --no-standby",
    )


REF_JOB = "grpo-slurm-reference"


@pytest.fixture
def reference_stack(tmp_path: Path) -> Iterator[DemoStack]:
    yield from _serving(DemoStack(tmp_path, free_port(), job=REF_JOB, schedule=None, node=NODE))


def test_the_reference_job_killed_in_its_first_step_is_requeued_through_rlguard_and_completes(
    slurm: Slurm, reference_stack: DemoStack, tmp_path: Path
) -> None:
    """The reference GRPO job as a Slurm batch job: its trainer killed -9 in the first step is
    a heavy heartbeat_lost; approved over REST, restart_job makes the job's supervisor requeue
    the batch job through Slurm; the requeued run resumes from the job's own state and the job
    completes every step, Slurm recording it COMPLETED, requeued once. The requeue is answered
    as done although Slurm stops the step (and the scontrol that asked) before scontrol returns."""
    stack, steps = reference_stack, 8
    approver = _approver_token(stack)
    run = RunDir(stack.run_dir)
    job = _submit_reference_job(slurm, run.root, tmp_path, steps)

    def logs() -> str:
        batch = "\n".join(
            p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("slurm-*.out")
        )
        roles = "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}"
            for f in sorted((run.root / "logs").glob("*.log"))
        )
        incidents = [(i["id"], i["kind"], i["tier"], i["subject"]) for i in stack.incidents()]
        return (
            f"--- batch\n{batch}\n{roles}\n--- slurm job\n{slurm.job(job)}\n"
            f"--- incidents\n{incidents}\n{slurm.logs()}"
        )

    def trainer_pid() -> int | None:
        pid = (read_json(run.root / "pids.json") or {}).get("trainer-0")
        return pid if isinstance(pid, int) else None

    try:
        # The trainer reports (phase past start-up) and has not finished step 1 yet.
        wait_for(
            lambda: trainer_pid() is not None and _server_step(stack, REF_JOB) >= 0,
            120,
            "the reference trainer to report",
            context=logs,
        )
        os.kill(trainer_pid(), signal.SIGKILL)  # type: ignore[arg-type]

        inc = wait_for(
            lambda: _incident(stack, "heartbeat_lost"), 60, "heartbeat_lost", context=logs
        )
        assert inc["tier"] == "heavy" and inc["subject"]["job"] == REF_JOB, inc
        pending = wait_for(
            lambda: _pending_for(stack, inc), 60, "the restart_job approval", context=logs
        )
        assert "restart_job" in [a["action"] for a in pending[0]["actions"]], pending
        assert slurm.job(job)["Restarts"] == "0"  # nothing requeued before the approval

        _approve(stack, approver, pending[0])
        assert (
            wait_for(lambda: _finished(stack, inc, "restart_job"), 90, "restart_job", context=logs)
            == "succeeded"
        ), _action(stack, inc, "restart_job")
        wait_for(lambda: slurm.job(job)["Restarts"] == "1", 60, "the requeue", context=logs)
        assert any(e["kind"] == "requeued" for e in read_run_events(run)), logs()

        wait_for(
            lambda: slurm.job(job)["JobState"] == "COMPLETED",
            180,
            "the requeued reference job to complete",
            context=logs,
        )
        assert run.done.exists()
        final = read_json(run.final) or {}
        assert final.get("step") == steps, final
        assert slurm.job(job)["Restarts"] == "1", logs()
    finally:
        subprocess.run(["scancel", job], env=slurm.env, timeout=30, check=False)
