"""Memory snapshots under the whole product: the real GRPOTrainer under ``rlguard launch``,
node agent, server, policy engine and Celery worker (``rlguard up``). A ``kill -9`` of the
trainer is seen (heartbeat_lost), RLGuard restarts it (restart_role through the launcher hook),
and the restart resumes from the newest memory snapshot: no ``checkpoint-N`` exists yet, and no
step finished before the kill's last one is trained again."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator

import pytest

from app.cli.demo import DemoStack
from tests.integration.integrations._trl import TRLJob, freeze

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def jobs() -> Iterator[list[TRLJob]]:
    started: list[TRLJob] = []
    yield started
    for job in started:
        job.stop()


def test_kill_9_restarted_by_rlguard_resumes_from_the_newest_snapshot(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    # save_steps past the kill: the only state to resume from is a snapshot.
    job = TRLJob(stack, "trl-snap-kill", max_steps=10, save_steps=10, snapshots=True)
    jobs.append(job)
    job.start()
    # Past the first-step window (a kill there is a heavy incident).
    job.wait(lambda: job.server_step() >= 3, 150, "the server to see step 3")
    pid = job.wait(job.trainer_pid, 30, "the trainer's pid")
    freeze(pid)  # the steps it finished cannot change between reading them and the kill
    finished = max(s["step"] for s in job.steps())
    assert finished < job.max_steps and job.newest_complete() is None
    os.kill(pid, signal.SIGKILL)

    inc = job.wait(lambda: job.action_done("heartbeat_lost", "restart_role"), 90,
                   "heartbeat_lost -> restart_role")  # fmt: skip
    assert inc["tier"] == "medium"
    assert job.wait_exit(150) == 0, job.logs()
    steps = job.steps()
    pids = list(dict.fromkeys(s["pid"] for s in steps))
    assert pids[0] == pid and len(pids) == 2, pids
    resumed_at = min(s["step"] for s in steps if s["pid"] == pids[1])
    # The snapshot of the last finished step is taken right after its log line: a kill before
    # that resumes from the step before (that one step again), never from further back.
    assert resumed_at in (finished, finished + 1), (resumed_at, finished)
    counts = Counter(s["step"] for s in steps)
    assert all(counts[s] == 1 for s in range(1, finished))
    assert sorted(counts) == list(range(1, job.max_steps + 1))
    trainer_log = (job.run_dir / "logs" / "trainer-0.log").read_text(errors="replace")
    assert f"resuming from the snapshot of step {resumed_at - 1}" in trainer_log
    assert job.heartbeat()["phase"] == "DONE"


def test_an_unwritable_persist_directory_alerts_and_the_run_completes(
    stack: DemoStack, jobs: list[TRLJob]
) -> None:
    """The launcher cannot persist the memory snapshots (``<run_dir>/snapshots`` is a file):
    checkpoint_write_errors opens (medium, no action, no SAFE_MODE) naming the directory and
    the error, and the run trains to its end on memory snapshots; no storage_unwritable."""
    job = TRLJob(stack, "trl-snap-nodisk", max_steps=8, save_steps=8, snapshots=True)
    jobs.append(job)
    (job.run_dir / "snapshots").write_text("not a directory", encoding="utf-8")
    job.start()
    inc = job.wait(lambda: job.incident("checkpoint_write_errors"), 150,
                   "checkpoint_write_errors")  # fmt: skip
    assert inc["tier"] == "medium" and inc["actions"] == [] and not inc["safe_mode"], inc
    extra = inc["evidence"]["extra"]
    assert extra["directory"].endswith("snapshots/rank-0"), extra
    assert extra["last_error"].startswith("[Errno "), extra
    assert job.wait_exit(150) == 0, job.logs()
    assert sorted({s["step"] for s in job.steps()}) == list(range(1, job.max_steps + 1))
    assert job.heartbeat()["phase"] == "DONE"
    assert job.incident("storage_unwritable") is None
