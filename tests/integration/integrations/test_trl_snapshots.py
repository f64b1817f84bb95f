"""Every-step memory snapshots of the real TRL ``GRPOTrainer`` (examples/trl_grpo/train.py, tiny
model) under the real ``rlguard launch``: ``kill -9`` at a named moment of a step (a deterministic
injector, ``--kill_at``), a restart through the launcher hook, and the run ends with final
parameters bit-identical to a clean run's and the same logged losses and rewards. A snapshot
torn by the kill is never resumed from. The faults of the snapshot path itself: ``/dev/shm``
too small (disk-only snapshots, resumed from disk), the persist directory unwritable (counted,
training goes on), the owner of the memory killed (the trainer persists by itself)."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from integrations.snapshot_owner import newest_verified, rank_dir
from recovery.checkpoint.layout import MARKER, list_dirs
from tests.harness import wait_for
from tests.integration.integrations._trl import LaunchedRun

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(420)]

KILL_STEP = 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trl-snapshots")


@pytest.fixture(scope="module")
def clean(root: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run nothing happens to: what every faulted run must end with."""
    run = LaunchedRun(root, "clean")
    try:
        run.start()
        assert run.finish() == 0, run.logs()
        assert [s for s, _ in run.steps()] == list(range(1, run.max_steps + 1))
        return run.final()
    finally:
        run.stop()


def _same_run(run: LaunchedRun, clean: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    params, logged = run.final()
    want_params, want_logged = clean
    assert sorted(params) == sorted(want_params)
    different = [k for k in params if not torch.equal(params[k], want_params[k])]
    assert different == [], f"parameters differ from the clean run's: {different}"
    assert logged == want_logged
    assert [e["step"] for e in logged] == list(range(1, run.max_steps + 1))


def _start(runs: list[LaunchedRun], root: Path, job: str, *extra: str) -> LaunchedRun:
    run = LaunchedRun(root, job, extra=extra)
    runs.append(run)
    run.start()
    return run


@pytest.mark.parametrize("moment", ["generation", "backward"])
def test_kill_9_inside_a_step_costs_no_finished_step(
    root: Path, runs: list[LaunchedRun], clean: Any, moment: str
) -> None:
    run = _start(runs, root, f"kill-{moment}", "--kill_at", f"{moment}:{KILL_STEP}")
    run.wait_exits(1)
    assert newest_verified(rank_dir(run.segment, 0)) is not None
    run.restart()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean)
    steps = run.steps()
    pids = list(dict.fromkeys(pid for _, pid in steps))
    assert len(pids) == 2
    # Every step finished once: the restart began at the step the kill interrupted.
    assert [s for s, _ in steps] == list(range(1, run.max_steps + 1))
    assert min(s for s, pid in steps if pid == pids[1]) == KILL_STEP
    assert f"resuming from the snapshot of step {KILL_STEP - 1}" in run.trainer_log()


def test_a_snapshot_torn_by_a_kill_is_never_resumed_from(
    root: Path, runs: list[LaunchedRun], clean: Any
) -> None:
    run = _start(runs, root, "kill-copy", "--kill_at", f"snapshot_copy:{KILL_STEP}")
    run.wait_exits(1)
    memory = rank_dir(run.segment, 0)
    # The kill came after the copy of step 4, before its checksum and marker.
    torn = [p for p in memory.iterdir() if p.name.startswith(".tmp-")]
    assert len(torn) == 1 and (torn[0] / "core.bin").exists() and not (torn[0] / MARKER).exists()
    newest = newest_verified(memory)
    assert newest is not None and newest[0] == KILL_STEP - 1
    run.restart()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean)
    counts = Counter(s for s, _ in run.steps())
    assert counts[KILL_STEP] == 2 and all(counts[s] == 1 for s in counts if s != KILL_STEP)
    assert f"resuming from the snapshot of step {KILL_STEP - 1}" in run.trainer_log()


def test_shm_too_small_falls_back_to_disk_and_resumes_from_disk(
    root: Path, runs: list[LaunchedRun], clean: Any
) -> None:
    run = _start(
        runs,
        root,
        "small-shm",
        "--snapshot_shm_limit",
        "4096",
        "--kill_at",
        f"backward:{KILL_STEP}",
    )
    run.wait_exits(1)
    log = run.trainer_log()
    assert "memory snapshots need 2 x" in log and "limit of 4,096 bytes" in log, log[-3000:]
    assert list_dirs(rank_dir(run.segment, 0)) == []  # nothing in memory
    disk = rank_dir(run.run_dir / "snapshots", 0)
    newest = newest_verified(disk)
    assert newest is not None and newest[0] == KILL_STEP - 1
    assert run.heartbeat().get("snapshot_persist_errors_total", 0) >= 1
    run.restart()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean)
    assert f"resuming from the snapshot of step {KILL_STEP - 1}" in run.trainer_log()


def test_an_unwritable_persist_directory_is_counted_and_training_goes_on(
    root: Path, runs: list[LaunchedRun], clean: Any
) -> None:
    run = LaunchedRun(root, "no-disk")
    runs.append(run)
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "snapshots").write_text("not a directory", encoding="utf-8")
    run.start()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean)
    assert "could not persist memory snapshot" in run.log.read_text(errors="replace")
    beat = run.heartbeat()
    # a snapshot-path fault (checkpoint_write_errors, training goes on), not the job's own
    # checkpoint errors (storage_unwritable, SAFE_MODE)
    assert beat["snapshot_persist_errors_total"] >= 1 and beat["checkpoint_write_errors_total"] == 0
    last = beat["snapshot_persist_last_error"]
    assert last["dir"].endswith("snapshots/rank-0") and last["error"].startswith("[Errno "), last


def test_the_owner_killed_the_trainer_persists_by_itself(
    root: Path, runs: list[LaunchedRun], clean: Any
) -> None:
    run = _start(runs, root, "owner-killed", "--min_step_seconds", "0.5")
    wait_for(lambda: len(run.steps()) >= 2, 240, "two steps", interval=0.05, context=run.logs)
    trainer = run.heartbeat()["pid"]
    assert run.proc is not None
    os.kill(run.proc.pid, signal.SIGKILL)  # the launcher alone: the trainer runs on
    run.proc.wait(30)

    def trainer_gone() -> bool:
        try:
            os.kill(trainer, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{trainer}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"

    wait_for(trainer_gone, 240, "the trainer to finish on its own", context=run.logs)
    assert [s for s, _ in run.steps()][-1] == run.max_steps
    log = run.trainer_log()
    assert "is gone: nobody persists the memory snapshots" in log, log[-3000:]
    newest = newest_verified(rank_dir(run.run_dir / "snapshots", 0))
    assert newest is not None and newest[0] == run.max_steps
    marker = json.loads((newest[1] / MARKER).read_text())
    assert marker["body"]["metadata"].get("kind") != "memory_snapshot"  # the trainer's own
    assert run.heartbeat()["snapshot_persist_errors_total"] >= 1
    _same_run(run, clean)
