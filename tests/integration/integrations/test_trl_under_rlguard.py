"""The real TRL ``GRPOTrainer`` (examples/trl_grpo/train.py, tiny size) under the real
``rlguard launch --integration trl``, node agent, server, policy engine and Celery worker
(``rlguard up``): a trainer killed mid-run, one killed while a checkpoint is being written and a
hung (SIGSTOPped) one are restarted by RLGuard and resume from the newest *complete* checkpoint;
a heavy incident holds the trainer in SAFE_MODE, saved and alive, until an approver releases it
and it goes on in the same process."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator

import pytest

from app.cli.demo import NODE, DemoStack
from integrations.trl.checkpoints import MARKER_NAME
from tests.integration.integrations._trl import TRLJob, freeze

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(200)]


@pytest.fixture
def jobs() -> Iterator[list[TRLJob]]:
    started: list[TRLJob] = []
    yield started
    for job in started:
        job.stop()


def _pids(job: TRLJob) -> list[int]:
    return list(dict.fromkeys(s["pid"] for s in job.steps()))


def _first_step_of(job: TRLJob, pid: int) -> int:
    return min(s["step"] for s in job.steps() if s["pid"] == pid)


def _resumed_cleanly(job: TRLJob, first_pid: int, complete: int, killed_at: int) -> None:
    """The run reached its last step; the second process started right after ``complete``;
    no step up to ``complete`` was trained twice, those after it (lost in the kill) twice."""
    steps = job.steps()
    assert steps[-1]["step"] == job.max_steps  # a clean run's last global step is max_steps
    pids = _pids(job)
    assert pids[0] == first_pid and len(pids) == 2, pids
    assert _first_step_of(job, pids[1]) == complete + 1
    counts = Counter(s["step"] for s in steps)
    assert all(counts[s] == 1 for s in range(1, complete + 1))
    assert all(counts[s] == 2 for s in range(complete + 1, killed_at + 1))
    assert sorted(counts) == list(range(1, job.max_steps + 1))
    assert job.heartbeat()["phase"] == "DONE"


def test_kill_9_mid_run_restarts_and_resumes_from_the_newest_complete_checkpoint(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    job = TRLJob(stack, "trl-kill", max_steps=20, save_steps=3)
    jobs.append(job)
    job.start()
    # Past the first-step window (a kill there is a heavy incident) and a sealed checkpoint.
    job.wait(lambda: job.server_step() >= 2, 120, "the server to see step 2")
    job.wait(lambda: job.newest_complete() is not None, 120, "a sealed checkpoint")
    pid = job.wait(job.trainer_pid, 30, "the trainer's pid")
    freeze(pid)  # what is complete cannot change between reading it and the kill
    complete = job.newest_complete()
    killed_at = max(s["step"] for s in job.steps())
    assert complete is not None and killed_at < job.max_steps
    os.kill(pid, signal.SIGKILL)

    inc = job.wait(lambda: job.action_done("heartbeat_lost", "restart_role"), 90,
                   "heartbeat_lost -> restart_role")  # fmt: skip
    assert inc["tier"] == "medium"
    assert job.wait_exit(150) == 0, job.logs()
    _resumed_cleanly(job, pid, complete, killed_at)


def test_kill_during_checkpoint_write_resumes_from_the_previous_complete_one(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    job = TRLJob(stack, "trl-torn", max_steps=8, save_steps=2, extra=("--stall_in_save_at", "4"))
    jobs.append(job)
    job.start()
    stalled = job.out / "stalled-in-save.pid"
    job.wait(stalled.exists, 150, "the trainer to be inside the save of checkpoint-4")
    pid = int(stalled.read_text())
    # The Trainer's files are there (its resume_from_checkpoint=True would take this one);
    # the marker is not.
    assert (job.out / "checkpoint-4" / "trainer_state.json").exists() and not job.sealed(4)
    assert job.newest_complete() == 2
    job.wait(lambda: job.server_step() >= 2, 60, "the server to see step 2")
    os.kill(pid, signal.SIGKILL)

    job.wait(lambda: job.action_done("heartbeat_lost", "restart_role"), 90,
             "heartbeat_lost -> restart_role")  # fmt: skip
    assert job.wait_exit(150) == 0, job.logs()
    _resumed_cleanly(job, pid, complete=2, killed_at=4)
    assert job.sealed(4) and job.sealed(8)  # written again, completely, by the resumed run
    launch_log = (stack.workdir / "logs" / f"launch-{job.job}.log").read_text(errors="replace")
    assert f"checkpoint-4: no {MARKER_NAME} marker" in launch_log


def test_a_sigstopped_trainer_is_hung_restarted_and_completes(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    job = TRLJob(stack, "trl-hang", max_steps=24, save_steps=3)
    jobs.append(job)
    job.start()
    # The hang detector judges only a trainer whose pace it has seen (hang_min_steps step times).
    seen: set[int] = set()

    def paced() -> bool:
        seen.add(job.server_step())
        return len(seen - {-1, 0}) >= 4 and job.newest_complete() is not None

    job.wait(paced, 150, "the server to see the step advance four times")
    # A hang: alive, heartbeat silent, the step does not move. Only time in hang_phases (ROLLOUT,
    # TRAIN) counts towards train_hang (a long SAVE is not a hang), so the trainer is stopped at
    # a moment its last heartbeat, the last thing the server will see of it, says one of those;
    # stopped in SAVE it would rightly be judged by its silent heartbeat (heartbeat_lost) instead.
    pid = job.wait(
        lambda: _frozen_in(job, ("ROLLOUT", "TRAIN")), 60, "the trainer frozen in a step"
    )
    complete = job.newest_complete()
    stopped_at = max(s["step"] for s in job.steps())
    assert complete is not None and stopped_at < job.max_steps

    # Within the silence limit (120 s, see TRLStack) plus the time the action takes.
    inc = job.wait(lambda: job.action_done("train_hang", "restart_role"), 150,
                   "train_hang -> restart_role")  # fmt: skip
    assert inc["tier"] == "medium" and job.incident("heartbeat_lost") is None
    # Hang forensics: the stopped trainer's Python stacks, read (py-spy, without pausing it
    # again) before the restart killed it, are on the incident: inside Trainer's training loop.
    [stacks] = [e["detail"] for e in inc["timeline"] if e["type"] == "stacks_captured"]
    assert stacks["pid"] == pid and stacks["ok"] is True and stacks["nonblocking"] is True
    assert "_inner_training_loop" in stacks["text"], stacks["text"][-2000:]
    assert job.wait_exit(150) == 0, job.logs()
    _resumed_cleanly(job, pid, complete, stopped_at)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the hung process was killed, not left stopped


def _frozen_in(job: TRLJob, phases: tuple[str, ...]) -> int | None:
    """SIGSTOP the trainer; keep it stopped only if its heartbeat, which cannot change while it is
    stopped, says one of ``phases`` (else SIGCONT, and None: the caller looks again)."""
    pid = job.trainer_pid()
    if pid is None or job.heartbeat().get("phase") not in phases:
        return None
    freeze(pid)
    beat = job.heartbeat()
    if beat.get("pid") == pid and beat.get("phase") in phases:
        return pid
    os.kill(pid, signal.SIGCONT)
    return None


def test_safe_mode_saves_pauses_alive_and_goes_on_in_the_same_process_after_release(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    job = TRLJob(stack, "trl-safe", max_steps=100_000, save_steps=4)
    jobs.append(job)
    # checkpoint-4 cannot be sealed (its marker's name is taken by a directory): a checkpoint
    # write the storage refused -> storage_unwritable, a heavy incident -> SAFE_MODE.
    (job.out / "checkpoint-4" / MARKER_NAME).mkdir(parents=True)
    job.start()
    pid = job.wait(job.trainer_pid, 120, "the trainer's pid")
    inc = job.wait(lambda: job.action_done("storage_unwritable", "enter_safe_mode"), 120,
                   "storage_unwritable -> enter_safe_mode")  # fmt: skip
    assert inc["tier"] == "heavy" and inc["safe_mode"]
    held = job.wait(lambda: job.heartbeat() if job.heartbeat().get("phase") == "SAFE_MODE" else None,
                    60, "the trainer to report SAFE_MODE")  # fmt: skip
    assert held["pid"] == pid and held["checkpoint_write_errors_total"] == 1
    paused_at = held["step"]
    assert job.sealed(paused_at) and held["checkpoint_step"] == paused_at  # saved first
    # Paused and alive: the heartbeat is rewritten, the step does not move.
    job.wait(lambda: job.heartbeat()["ts"] > held["ts"] + 1.0, 30, "a fresh heartbeat while paused")
    assert job.steps()[-1]["step"] == paused_at and job.heartbeat()["phase"] == "SAFE_MODE"

    [approval] = [a for a in stack.pending_approvals() if a["incident_id"] == inc["id"]]
    r = stack.api("POST", f"/api/v1/approvals/{approval['id']}/reject",
                  json={"comment": "no restore: the disk is fine, release instead"})  # fmt: skip
    assert r.status_code == 200, r.text
    r = stack.api("POST", f"/api/v1/jobs/{job.job}/release", json={"comment": "checked the disk"})
    assert r.status_code == 202, r.text

    job.wait(lambda: job.steps()[-1]["step"] >= paused_at + 3, 90, "training to go on")
    assert _pids(job) == [pid]  # the same process, never restarted
    assert job.heartbeat()["phase"] in ("ROLLOUT", "TRAIN", "SAVE")
    # The GRPO metrics went all the way: callback -> heartbeat -> agent -> server.
    r = stack.api(
        "GET", "/api/v1/series", params={"node": NODE, "name": "grpo_reward_mean", "since": 0}
    )
    assert r.status_code == 200, r.text
    assert any(s["labels"].get("job") == job.job and s["points"] for s in r.json()["data"])
