"""Several ranks, one consistent step (issue 39 item 2): the real TRL ``GRPOTrainer``
(examples/trl_grpo/train.py, tiny model) on two ranks with gloo under the real ``rlguard launch
--nproc 2``, every-step memory snapshots, and the checkpoint coordinator's round committing a
step only when both ranks hold it. Rank 1 is ``kill -9``'d by the deterministic injector right
after its own snapshot of step 3, before the round that would commit it; rank 0 cannot go on
without it and exits. A restart through the launcher hook resumes *both* ranks from step 2,
the committed step, though rank 1's memory holds a verified snapshot of step 3, and the run
ends with final parameters bit-identical to a clean two-rank run's and the same logged losses
and rewards; both ranks reuse step 3's logged generation batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from integrations.snapshot_owner import rank_dir
from integrations.snapshot_rounds import STATE_FILE, verified_steps
from recovery.report import heartbeat_path, read_heartbeat
from tests.integration.integrations._trl import ROOT, LaunchedRun

# Two ranks of the tiny model on a loaded 2-core machine: ~1-2 min to start, seconds a step.
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1200)]

MAX_STEPS = 4
KILL_STEP = 3
RANKS = (0, 1)


class TwoRanks(LaunchedRun):
    """A :class:`LaunchedRun` with ``--nproc 2``: both ranks restarted together (a
    data-parallel rank cannot rejoin a process group whose other member runs on)."""

    def __init__(self, root: Path, job: str, *extra: str) -> None:
        super().__init__(root, job, max_steps=MAX_STEPS, save_steps=2, extra=extra)
        at = self.argv.index("--role")
        self.argv[at:at] = ["--nproc", "2"]

    def restart(self) -> None:
        self._restarts += 1
        done = subprocess.run(
            [sys.executable, "-m", "integrations.launch", "hook", "restart_role",
             f"--job={self.job}", "--role=trainer",
             f"--idempotency-key={self.job}-restart-{self._restarts}",
             f"--run-root={self.root}", "--wait=240"],
            cwd=ROOT, capture_output=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()

    def stop(self) -> None:
        super().stop()
        beat = read_heartbeat(heartbeat_path(self.run_dir, "trainer", 1)) or {}
        if isinstance(beat.get("pid"), int):
            try:
                os.kill(beat["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def rank_log(self, rank: int) -> str:
        path = self.run_dir / "logs" / f"trainer-{rank}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        launch = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        ranks = "\n".join(f"--- rank {r}\n{self.rank_log(r)[-3000:]}" for r in RANKS)
        return f"--- launch\n{launch}\n{ranks}"

    def committed(self) -> int | None:
        state = json.loads((self.run_dir / STATE_FILE).read_text(encoding="utf-8"))
        return int(state["global_version"]["training_step"])


def test_a_rank_killed_after_its_own_snapshot_both_resume_from_the_committed_step(
    tmp_path: Path, runs: list[LaunchedRun]
) -> None:
    clean = TwoRanks(tmp_path, "ranks-clean")
    runs.append(clean)
    clean.start()
    assert clean.finish(600) == 0, clean.logs()
    assert clean.committed() == MAX_STEPS  # every step's round committed
    want_params, want_logged = clean.final()

    run = TwoRanks(tmp_path, "ranks-kill", "--kill_at", f"snapshot_saved:{KILL_STEP}",
                   "--kill_rank", "1")  # fmt: skip
    runs.append(run)
    run.start()
    run.wait_exits(2, timeout=600)  # rank 1 killed; rank 0 fails without its peer
    # Rank 1 was killed after its own snapshot of step 3 was committed in its memory, before
    # the round: step 3 is held but was never committed, so nobody resumes from it.
    assert KILL_STEP in verified_steps(rank_dir(run.segment, 1))
    assert run.committed() == KILL_STEP - 1
    run.restart()
    assert run.finish(600) == 0, run.logs()

    for rank in RANKS:
        log = run.rank_log(rank)
        assert f"resuming from the snapshot of step {KILL_STEP - 1}" in log, log[-3000:]
        # Step 3's round never committed, so its logged generation batch is still PENDING on
        # both ranks and both reuse it (a rank generating while the other reuses would hang
        # in GRPO's gather).
        assert f"reused the logged generation of step {KILL_STEP} " in log, log[-3000:]
    assert f"ranks resume from step {KILL_STEP - 1}" in run.log.read_text(errors="replace")
    steps = run.steps()
    pids = list(dict.fromkeys(pid for _, pid in steps))
    assert len(pids) == 4  # two ranks, two incarnations each
    for pid in pids[2:]:  # the restarted ranks began at the step after the committed one
        assert min(s for s, p in steps if p == pid) == KILL_STEP
    assert run.committed() == MAX_STEPS
    params, logged = run.final()
    assert sorted(params) == sorted(want_params)
    different = [k for k in params if not torch.equal(params[k], want_params[k])]
    assert different == [], f"parameters differ from the clean two-rank run's: {different}"
    assert logged == want_logged
    assert [e["step"] for e in logged] == list(range(1, MAX_STEPS + 1))
