"""``rlguard drill`` on the TRL example (examples/trl_grpo/train.py, tiny size) under the real
``rlguard launch --integration trl``, node agent and ``rlguard up``: what a generic launcher
cannot inject (disk-full: the callback declares no such point) is refused with its reason and
nothing injected; a kill drill is injected by the launcher, healed by RLGuard (heartbeat_lost ->
restart_role), reported with its numbers and marked as a drill; an oom drill uses the injection
point RLGuard's TRL callback declared (its next optimizer step raises torch.OutOfMemoryError):
the launcher's exit-cause catalogue names it, cuda_oom -> restart_role; and the run still
completes. A hang drill (SIGSTOP) on a run
with TRL's generation log: seen hung, restarted, and the report counts the generation batches
the restart did again and those it reused from the log (the run's own events say the same)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime

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

    def make(name: str, *extra: str) -> TRLJob:
        made.append(TRLJob(stack, name, max_steps=40, save_steps=3, extra=extra))
        return made[-1]

    yield make
    for j in made:
        j.stop()


def _drill(stack: DemoStack, *args: str, job: str = "trl-drill") -> subprocess.CompletedProcess[str]:
    env = rlguard_env(None, stack.workdir / "data", RLGUARD_URL=stack.url,
                      RLGUARD_TOKEN=stack.token)
    return run_cli("drill", "--job", job, "--role", "trainer", *args, env=env,
                   timeout=300)


def _trains(job: TRLJob) -> int:
    """Past the first-step window (a fault there is heavy), a sealed checkpoint to resume
    from; the trainer's pid."""
    job.start()
    job.wait(lambda: job.server_step() >= 2, 120, "the server to see step 2")
    job.wait(lambda: job.newest_complete() is not None, 120, "a sealed checkpoint")
    pid: int = job.wait(job.trainer_pid, 30, "the trainer's pid")
    return pid


def test_kill_and_oom_drills_on_the_trl_example_and_what_it_cannot_inject(
    stack: DemoStack, jobs: Callable[..., TRLJob]
) -> None:
    job = jobs("trl-drill")
    pid = _trains(job)
    for fault, why in (("disk-full", "cannot make the next checkpoint write of a generic"),):
        r = _drill(stack, "--fault", fault)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and why in lines[0], r.stderr
        assert f"the launcher refused: cannot inject {fault}: " in lines[0], lines
    assert job.trainer_pid() == pid  # nothing injected
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
    assert rep["counted_in_ettr"] is False
    # No generation log (it comes with snapshots, off here): nothing to count, and it says so.
    assert rep["generations_redone"] is None, rep
    assert rep["generations_note"].startswith("not measured: the job records no generations")
    assert "generations redone  not measured: the job records no generations" in out
    _oom_drill(stack, job, pid)
    assert job.wait_exit(200) == 0, job.logs()


def _oom_drill(stack: DemoStack, job: TRLJob, killed_pid: int) -> None:
    """The restarted trainer declared its oom point: drilled through it, healed as an OOM."""
    pid: int = job.wait(lambda: (p := job.trainer_pid()) != killed_pid and p, 60,
                        "the restarted trainer's pid")
    r = _drill(stack, "--fault", "oom", "--timeout", "240")
    out = r.stdout
    print(out)  # the printed report, for whoever runs this with -s
    assert r.returncode == 0, (r.stderr, out, job.logs())
    assert "oom trainer-0 of job trl-drill" in out and "recovered" in out.splitlines()[0], out
    assert (f"trainer-0 (pid {pid}), its own injection point: its next optimizer step raises "
            "torch.OutOfMemoryError") in out
    d = stack.api("GET", f"/api/v1/drills/{int(out.split(':')[0].split()[1])}").json()
    rep = d["report"]
    # As with a real OOM: the callback counts the failed step as the process dies (step_failed,
    # light: skip_failed_step restarts the role past it) and the launcher names the exit from
    # its traceback (cuda_oom, medium: restart_role); the signal seen first opens the incident.
    assert rep["incident"]["kind"] in ("step_failed", "cuda_oom"), rep
    assert rep["actions"][-1]["action"] in ("skip_failed_step", "restart_role"), rep
    assert rep["actions"][-1]["status"] == "succeeded", rep
    assert 0 <= rep["detection_delay_seconds"] < rep["time_to_first_new_step_seconds"] < 240
    assert rep["counted_in_ettr"] is False
    injected = datetime.fromisoformat(d["injected_at"]).timestamp()
    after = [e for e in read_events(job.run_dir / "events.jsonl") if e["ts"] >= injected]
    exit_ = next(e for e in after if e.get("kind") == "child_exit")
    assert exit_["cause"] == "cuda_oom" and exit_["code"] == 1, exit_
    assert "OutOfMemoryError: CUDA out of memory" in exit_["line"], exit_
    assert any(e.get("kind") == "hook_request" and e.get("action") == "restart_role"
               and e["ts"] >= exit_["ts"] for e in after), after  # RLGuard restarted it


def _events(job: TRLJob, kind: str, since: float, until: float) -> int:
    return sum(1 for e in read_events(job.run_dir / "events.jsonl")
               if e.get("kind") == kind and since <= e["ts"] <= until)


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
    assert rep["actions"][-1] == {**rep["actions"][-1], "action": "restart_role",
                                  "status": "succeeded"}, rep
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
    for kind, figure in (("generation_redone", "generations_redone"),
                         ("generation_reused", "generations_reused")):
        low, high = (_events(job, kind, injected, finished),
                     _events(job, kind, injected, float("inf")))
        assert low <= rep[figure] <= high, (kind, rep, low, high)
    assert f"generations redone  {generations_text(rep)}" in out
    assert generations_text(rep).endswith(" reused instead)"), rep
    assert job.wait_exit(200) == 0, job.logs()
