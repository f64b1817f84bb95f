"""``rlguard drill`` on the TRL example (examples/trl_grpo/train.py, tiny size) under the real
``rlguard launch --integration trl``, node agent and ``rlguard up``: a kill drill is injected by
the launcher, healed by RLGuard (heartbeat_lost -> restart_role), reported with its numbers and
marked as a drill; an oom drill uses the injection point RLGuard's TRL callback declared (its
next optimizer step raises torch.OutOfMemoryError): the launcher's exit-cause catalogue names
it, cuda_oom -> restart_role; a disk-full drill uses the callback's other point (the next step
end's checkpoint save fails with ENOSPC): disk_full, heavy (SAFE_MODE, which refuses the next
drill; restore_checkpoint waits for a person), and once approved the run resumes from the
newest sealed checkpoint and trains on. A hang drill (SIGSTOP) on a run
with TRL's generation log: seen hung, restarted, and the report counts the generation batches
the restart did again and those it reused from the log (the run's own events say the same)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from app.cli.demo import DemoStack
from app.drills.figures import generations_text
from recovery.supervision.events import read_events
from tests.harness import rlguard_env, run_cli
from tests.integration.integrations._trl import TRLJob

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(400)]


@pytest.fixture
def jobs(stack: DemoStack) -> Iterator[Callable[..., TRLJob]]:
    """Make a job of the example (stopped after the test whatever happened)."""
    made: list[TRLJob] = []

    def make(name: str, *extra: str, max_steps: int = 40) -> TRLJob:
        made.append(TRLJob(stack, name, max_steps=max_steps, save_steps=3, extra=extra))
        return made[-1]

    yield make
    for j in made:
        j.stop()


def _drill(
    stack: DemoStack, *args: str, job: str = "trl-drill"
) -> subprocess.CompletedProcess[str]:
    env = rlguard_env(
        None, stack.workdir / "data", RLGUARD_URL=stack.url, RLGUARD_TOKEN=stack.token
    )
    return run_cli("drill", "--job", job, "--role", "trainer", *args, env=env, timeout=300)


def _trains(job: TRLJob) -> int:
    """Past the first-step window (a fault there is heavy), a sealed checkpoint to resume
    from; the trainer's pid."""
    job.start()
    job.wait(lambda: job.server_step() >= 2, 120, "the server to see step 2")
    job.wait(lambda: job.newest_complete() is not None, 120, "a sealed checkpoint")
    pid: int = job.wait(job.trainer_pid, 30, "the trainer's pid")
    return pid


def test_kill_oom_and_disk_full_drills_on_the_trl_example(
    stack: DemoStack, jobs: Callable[..., TRLJob]
) -> None:
    # Long enough (a step is >= 0.2 s) to be still training at the third drill on a quiet host.
    job = jobs("trl-drill", max_steps=150)
    pid = _trains(job)
    r = _drill(stack, "--fault", "kill", "--timeout", "240")
    out = r.stdout
    assert r.returncode == 0, (r.stderr, out, job.logs())
    assert out.startswith("drill ") and "kill trainer-0 of job trl-drill" in out
    assert "recovered" in out.splitlines()[0], out
    assert f"SIGKILL trainer-0 (pid {pid})" in out
    drill_id = int(out.split(":")[0].split()[1])
    d = stack.api("GET", f"/api/v1/drills/{drill_id}").json()
    rep = d["report"]
    assert rep["incident"]["kind"] == "heartbeat_lost", rep
    assert [a["action"] for a in rep["actions"]] == ["restart_role"], rep
    assert 0 <= rep["detection_delay_seconds"] < rep["time_to_first_new_step_seconds"] < 240
    assert rep["whole_job_restart"]["seconds_lost"] > rep["seconds_lost"] >= 0
    # Resumed from the newest sealed checkpoint (save_steps 3; one being sealed as the kill
    # came is not one): not from the start (the restarted process's start-up reports are not a
    # restore to step 0).
    assert 0 <= rep["steps_redone"] <= 6, rep
    assert rep["counted_in_ettr"] is False
    # No generation log (it comes with snapshots, off here): nothing to count, and it says so.
    assert rep["generations_redone"] is None, rep
    assert rep["generations_note"].startswith("not measured: the job records no generations")
    assert "generations redone  not measured: the job records no generations" in out
    oom_pid = _oom_drill(stack, job, pid)
    _disk_full_drill(stack, job, oom_pid)


def _quiet(stack: DemoStack, job: TRLJob) -> None:
    """Wait until the job has no open incident: the last drill's resolves after the policy's
    quiet period, and a process with an open incident is not drilled (refused)."""
    job.wait(
        lambda: (
            not [
                i
                for i in stack.incidents()
                if i["status"] == "open" and i["subject"].get("job") == job.job
            ]
        ),
        120,
        "the last drill's incident to resolve",
    )


def _oom_drill(stack: DemoStack, job: TRLJob, killed_pid: int) -> int:
    """The restarted trainer declared its oom point: drilled through it, healed as an OOM;
    the pid it was drilled in."""
    pid: int = job.wait(
        lambda: (p := job.trainer_pid()) != killed_pid and p, 60, "the restarted trainer's pid"
    )
    _quiet(stack, job)
    r = _drill(stack, "--fault", "oom", "--timeout", "240")
    out = r.stdout
    print(out)  # the printed report, for whoever runs this with -s
    assert r.returncode == 0, (r.stderr, out, job.logs())
    assert "oom trainer-0 of job trl-drill" in out and "recovered" in out.splitlines()[0], out
    assert (
        f"trainer-0 (pid {pid}), its own injection point: its next optimizer step raises "
        "torch.OutOfMemoryError"
    ) in out
    d = stack.api("GET", f"/api/v1/drills/{int(out.split(':')[0].split()[1])}").json()
    rep = d["report"]
    # As with a real OOM: the callback counts the failed step as the process dies (step_failed,
    # light: skip_failed_step restarts the role past it) and the launcher names the exit from
    # its traceback (cuda_oom, medium: restart_role); the signal seen first opens the incident.
    assert rep["incident"]["kind"] in ("step_failed", "cuda_oom"), rep
    assert rep["actions"][-1]["action"] in ("skip_failed_step", "restart_role"), rep
    assert rep["actions"][-1]["status"] == "succeeded", rep
    assert 0 <= rep["detection_delay_seconds"] < rep["time_to_first_new_step_seconds"] < 240
    assert 0 <= rep["steps_redone"] <= 6, rep
    assert rep["counted_in_ettr"] is False
    injected = datetime.fromisoformat(d["injected_at"]).timestamp()
    after = [e for e in read_events(job.run_dir / "events.jsonl") if e["ts"] >= injected]
    exit_ = next(e for e in after if e.get("kind") == "child_exit")
    assert exit_["cause"] == "cuda_oom" and exit_["code"] == 1, exit_
    assert "OutOfMemoryError: CUDA out of memory" in exit_["line"], exit_
    assert any(
        e.get("kind") == "hook_request"
        and e.get("action") == "restart_role"
        and e["ts"] >= exit_["ts"]
        for e in after
    ), after  # RLGuard restarted it
    return pid


def _disk_full_drill(stack: DemoStack, job: TRLJob, oom_pid: int) -> None:
    """The callback's disk-full point: the checkpoint save fails as a full disk's would, the
    launcher names it (disk_full: storage_unwritable, heavy), SAFE_MODE refuses the next drill,
    and a person's approval of restore_checkpoint resumes the run from its newest sealed
    checkpoint (the one before the failed save)."""
    pid: int = job.wait(
        lambda: (p := job.trainer_pid()) != oom_pid and p,
        60,
        "the trainer restarted after the oom drill",
    )
    _quiet(stack, job)
    r = _drill(stack, "--fault", "disk-full", "--no-wait")
    assert r.returncode == 0, (r.stderr, r.stdout, job.logs())
    assert (
        f"trainer-0 (pid {pid}), its own injection point: its next step end saves a "
        "checkpoint and the save fails with ENOSPC"
    ) in r.stdout, r.stdout
    drill_id = int(r.stdout.split(":")[0].split()[1])

    def heavy() -> dict[str, Any] | None:
        d = stack.api("GET", f"/api/v1/drills/{drill_id}").json()
        inc = (d["report"] or {}).get("incident")
        return d if inc and inc["kind"] == "storage_unwritable" else None

    d = job.wait(heavy, 120, "storage_unwritable")
    assert d["report"]["incident"]["tier"] == "heavy" and d["report"]["recovered"] is False, d
    injected = datetime.fromisoformat(d["injected_at"]).timestamp()
    exit_ = job.wait(
        lambda: next(
            (
                e
                for e in read_events(job.run_dir / "events.jsonl")
                if e["ts"] >= injected and e.get("kind") == "child_exit"
            ),
            None,
        ),
        60,
        "the trainer's exit",
    )
    assert exit_["cause"] == "disk_full" and "No space left on device" in exit_["line"], exit_
    # The failed save left nothing of itself: the newest sealed checkpoint is an older one.
    failed = int(re.search(r"checkpoint-(\d+) was not written", exit_["line"]).group(1))
    assert not (job.out / f"checkpoint-{failed}").exists()
    assert (job.newest_complete() or 0) < failed

    def refused_for_safe_mode() -> subprocess.CompletedProcess[str] | None:
        r = _drill(stack, "--fault", "kill")
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        return r if "SAFE_MODE" in r.stderr else None

    refused = job.wait(refused_for_safe_mode, 120, "SAFE_MODE")
    assert f"job '{job.job}' is in SAFE_MODE (incident " in refused.stderr, refused.stderr
    incident = d["report"]["incident"]["id"]
    [approval] = job.wait(
        lambda: [a for a in stack.pending_approvals() if a["incident_id"] == incident],
        60,
        "the approval",
    )
    assert [a["action"] for a in approval["actions"]] == ["restore_checkpoint"], approval
    r2 = stack.api(
        "POST",
        f"/api/v1/approvals/{approval['id']}/approve",
        json={"comment": "disk-full drill: resume from the sealed checkpoint"},
    )
    assert r2.status_code == 200, r2.text
    # Released and restarted: it trains past the step whose save failed, out of SAFE_MODE,
    # with no second incident for the same full disk (the run's end is not waited for: 150
    # steps take minutes on a loaded host; the other drills' runs are seen to finish).
    job.wait(lambda: job.server_step() > failed, 180, f"a step past {failed} after the restore")
    assert [
        i["kind"]
        for i in stack.incidents()
        if i["subject"].get("job") == job.job and i["kind"] == "storage_unwritable"
    ] == ["storage_unwritable"]


def _events(job: TRLJob, kind: str, since: float, until: float) -> int:
    return sum(
        1
        for e in read_events(job.run_dir / "events.jsonl")
        if e.get("kind") == kind and since <= e["ts"] <= until
    )


def test_hang_drill_on_the_trl_example_counts_the_generations_redone_and_reused(
    stack: DemoStack, jobs: Callable[..., TRLJob]
) -> None:
    job = jobs("trl-drill-hang", "--generation_log", "on")
    pid = _trains(job)
    r = _drill(stack, "--fault", "hang", "--timeout", "240", job=job.job)
    out = r.stdout
    assert r.returncode == 0, (r.stderr, out, job.logs())
    print(out)  # the printed report, for whoever runs this with -s
    assert "hang trainer-0 of job trl-drill-hang" in out and "recovered" in out.splitlines()[0]
    assert f"SIGSTOP trainer-0 (pid {pid})" in out
    d = stack.api("GET", f"/api/v1/drills/{int(out.split(':')[0].split()[1])}").json()
    rep = d["report"]
    # Seen hung (its heartbeat stops moving, or its step does), stacks taken, then restarted.
    assert rep["incident"]["kind"] in ("train_hang", "heartbeat_lost"), rep
    assert rep["actions"][-1] == {
        **rep["actions"][-1],
        "action": "restart_role",
        "status": "succeeded",
    }, rep
    assert 0 <= rep["detection_delay_seconds"] < rep["time_to_first_new_step_seconds"] < 240
    assert rep["counted_in_ettr"] is False
    # Counted on the node from the run's own events: the steps redone from the checkpoint
    # generated their batches again (their log entries were committed), an open one was reused
    # (how many of each depends on where the step was when it hung: 0 is possible).
    injected = datetime.fromisoformat(d["injected_at"]).timestamp()
    finished = datetime.fromisoformat(d["finished_at"]).timestamp()
    assert rep["unit"] == "batches", rep
    # The count ran after the drill's end was timed: every event up to then is in it, and a
    # later one may be.
    for kind, figure in (
        ("generation_redone", "generations_redone"),
        ("generation_reused", "generations_reused"),
    ):
        low, high = (
            _events(job, kind, injected, finished),
            _events(job, kind, injected, float("inf")),
        )
        assert low <= rep[figure] <= high, (kind, rep, low, high)
    assert f"generations redone  {generations_text(rep)}" in out
    assert generations_text(rep).endswith(" reused instead)"), rep
    assert job.wait_exit(200) == 0, job.logs()
