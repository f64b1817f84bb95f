"""The Slurm launcher backend against a real slurmctld + slurmd (see conftest.py).

1. A batch job runs ``rlguard launch --backend slurm`` around a small worker. Its rank is
   killed (kill -9): the launcher writes EXITED into the heartbeat (what RLGuard's policy sees);
   the approved ``restart_job`` reaches the launcher through the launcher hook, exactly as the
   server's action task sends it; the backend requeues the job through Slurm, the batch script
   runs again (SLURM_RESTART_COUNT 1), the worker resumes and the job COMPLETES.
2. A simulated XID 79 drains the node with RLGuard's reason; an application XID does not; the
   agent's --slurm-node collector then reports the node unavailable (a lost node).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agents.collectors.slurm import SlurmNodeCollector
from app.actions.machine import ActionSnapshot
from app.tasks.recovery_adapters import ADAPTERS, ActionContext
from recovery.supervision.backends import BackendError, load_backend
from recovery.supervision.backends.slurm import (
    SlurmBackend,
    drain_reason_for_xid,
    node_is_lost,
)
from tests.integration.slurm._slurm import NODE, Slurm, wait_until

REPO = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WORKER = """\
import os, pathlib, time
run = pathlib.Path(os.environ["RLGUARD_RUN_DIR"])
restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
progress = run / "progress"
step = int(progress.read_text()) if progress.exists() else 0
with open(run / "work.log", "a") as log:
    log.write(f"start step={step} restart={restarts} pid={os.getpid()}\\n")
while restarts == "0" or step < 5:  # the first run works until it is killed
    time.sleep(0.1)
    step += 1
    progress.write_text(str(step))
with open(run / "work.log", "a") as log:
    log.write(f"done step={step}\\n")
"""


def test_kill_a_rank_then_restart_job_requeues_through_slurm_and_the_job_completes(
    slurm: Slurm, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    run = root / "grpo-slurm"
    run.mkdir(parents=True)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -m integrations.launch --job grpo-slurm --role worker --rank 0 "
        f"--run-dir {run} --backend slurm --backoff 0 -- {sys.executable} {worker}\n"
    )
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--requeue",
            f"--chdir={REPO}",
            f"--output={tmp_path}/slurm-%j.out",
            str(script),
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    log = run / "work.log"

    def batch_output() -> str:
        return "\n".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))

    wait_until(
        lambda: log.exists() and "restart=0" in log.read_text(),
        60,
        f"the worker to start\n{batch_output()}",
        slurm,
    )
    pid = int(log.read_text().split("pid=")[1].split()[0])
    os.kill(pid, signal.SIGKILL)
    heartbeat = run / "heartbeat" / "worker-0.json"
    wait_until(
        lambda: json.loads(heartbeat.read_text()).get("phase") == "EXITED",
        30,
        "the launcher to report the exit",
        slurm,
    )

    # RLGuard's approved restart_job, through the launcher hook (as the action task runs it).
    hook = subprocess.run(
        [
            sys.executable,
            "-m",
            "integrations.launch",
            "hook",
            "restart_job",
            "--job",
            "grpo-slurm",
            "--run-root",
            str(root),
            "--idempotency-key",
            "it-restart-job-1",
            "--wait",
            "60",
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=90,
        cwd=REPO,
    )
    assert hook.returncode == 0, (hook.stdout, hook.stderr, batch_output())
    answer = json.loads(hook.stdout)
    assert answer["ok"] and answer["requeued"], answer

    wait_until(
        lambda: slurm.job(job).get("JobState") == "COMPLETED",
        60,
        f"the requeued job to complete\n{batch_output()}\n{slurm.job(job)}",
        slurm,
    )
    lines = log.read_text().splitlines()
    assert lines[0].startswith("start step=0 restart=0")
    assert any(line.startswith("start step=") and "restart=1" in line for line in lines), lines
    assert lines[-1].startswith("done"), lines
    assert slurm.job(job).get("Restarts") == "1"


def test_approved_drain_node_action_drains_through_the_launcher_hook(
    slurm: Slurm, tmp_path: Path
) -> None:
    """RLGuard's drain_node action (planned for XID 79, run once approved) as the action task
    runs it: the adapter calls the launcher hook, the launcher inside the Slurm job drains the
    node through its backend."""
    root = tmp_path / "runs"
    run = root / "grpo-drain"
    run.mkdir(parents=True)
    worker = tmp_path / "worker.py"
    worker.write_text("import time\nwhile True:\n    time.sleep(0.2)\n")
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"exec {sys.executable} -m integrations.launch --job grpo-drain --role worker --rank 0 "
        f"--run-dir {run} --backend slurm -- {sys.executable} {worker}\n"
    )
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--chdir={REPO}",
            f"--output={tmp_path}/slurm-%j.out",
            str(script),
        ],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    hook = tmp_path / "rlguard-hook"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "integrations.launch",
            "write-hook",
            str(hook),
            "--run-root",
            str(root),
        ],
        check=True,
        cwd=REPO,
        timeout=60,
    )
    try:
        wait_until(
            lambda: (run / "recovery").exists() and slurm.job(job)["JobState"] == "RUNNING",
            60,
            "the launcher to run in the job",
            slurm,
        )
        action = ActionSnapshot(
            id=1,
            incident_id=7,
            action="drain_node",
            job="grpo-drain",
            node=NODE,
            params={"xid": 79, "gpu": "1"},
            attempts=0,
            idempotency_key="inc7/s1/drain_node",
        )
        ctx = ActionContext(run_root=root, launcher=str(hook), launcher_timeout=60)
        result = ADAPTERS["drain_node"](ctx, action)
        assert result["exit"] == 0, result
        node = slurm.node()
        assert "DRAIN" in node["State"], node
        assert node["Reason"].startswith(
            "rlguard: gpu 1 XID 79 (GPU fallen off the bus) [incident 7]"
        ), node
    finally:
        subprocess.run(["scancel", job], env=slurm.env, timeout=30, check=False)
        if node_is_lost(slurm.node()["State"]):
            slurm.scontrol("update", f"NodeName={NODE}", "State=RESUME")


def test_simulated_xid_79_drains_the_node_with_rlguards_reason(slurm: Slurm) -> None:
    backend = SlurmBackend(node=NODE, environ=slurm.env)
    assert drain_reason_for_xid(13) is None  # an application fault: the node stays in service
    reason = drain_reason_for_xid(79, gpu="1")
    assert reason == "rlguard: gpu 1 XID 79 (GPU fallen off the bus)"
    try:
        os.environ["SLURM_CONF"] = str(slurm.conf)  # the backend's scontrol finds the cluster
        backend.drain_node(reason)
        node = slurm.node()
        assert "DRAIN" in node["State"] and node_is_lost(node["State"]), node
        assert node["Reason"].startswith(reason), node
        # The backend's own read: drained too (not equal to the read above: flags such as
        # COMPLETING or NOT_RESPONDING come and go between two reads on a busy machine).
        state = backend.node_state()
        assert state is not None and "DRAIN" in state and node_is_lost(state), state
        # The agent's --slurm-node collector reports the drained node as unavailable (lost).
        samples = {s["name"]: s["value"] for s in SlurmNodeCollector(NODE).collect()}
        assert samples == {"slurm_node_unavailable": 1, "slurm_jobs_running": 0}
        with pytest.raises(BackendError, match="one-line reason"):
            backend.drain_node("two\nlines")
        slurm.scontrol("update", f"NodeName={NODE}", "State=RESUME")
        assert not node_is_lost(slurm.node()["State"])
        samples = {s["name"]: s["value"] for s in SlurmNodeCollector(NODE).collect()}
        assert samples["slurm_node_unavailable"] == 0
        # An unknown node is not a lost one: nothing is sent (and it is logged once).
        assert SlurmNodeCollector("no-such-node").collect() == []
    finally:
        if node_is_lost(slurm.node()["State"]):  # leave the node in service for other tests
            slurm.scontrol("update", f"NodeName={NODE}", "State=RESUME")
        os.environ.pop("SLURM_CONF", None)


def test_slurm_backend_outside_a_job_is_refused_naming_why(slurm: Slurm) -> None:
    backend = load_backend("slurm")
    assert isinstance(backend, SlurmBackend)
    with pytest.raises(BackendError, match="SLURM_JOB_ID is not set"):
        SlurmBackend(environ={}).check()
    with pytest.raises(BackendError, match="not a job id"):
        SlurmBackend(environ={"SLURM_JOB_ID": "12; rm -rf /"}).check()
    with pytest.raises(BackendError, match="does not know job 999999"):
        os.environ["SLURM_CONF"] = str(slurm.conf)
        try:
            SlurmBackend(environ={"SLURM_JOB_ID": "999999"}).check()
        finally:
            os.environ.pop("SLURM_CONF", None)
