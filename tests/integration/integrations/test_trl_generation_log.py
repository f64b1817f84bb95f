"""Logged generations of the real TRL ``GRPOTrainer`` (examples/trl_grpo/train.py, tiny model)
under the real ``rlguard launch`` with memory snapshots: ``kill -9`` right after a generation
batch was logged and before the optimizer step (a deterministic injector, ``--kill_at
generation_logged:STEP``), a restart through the launcher hook, and the logged batch is reused
(no generation made twice) with final parameters bit-identical to a clean run's and the same
logged losses and rewards. With ``steps_per_generation`` 2 the buffered generation survives a
kill inside its span. A logged batch whose data fails its checksum is never reused. A
generation log directory that is a file stops the script with a message naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from integrations.snapshot_owner import rank_dir
from integrations.trl._generation_store import parse_entry_id
from recovery.wal import WALStatus, WriteAheadLog
from tests.integration.integrations._trl import EXAMPLE, ROOT, LaunchedRun

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(600)]

KILL_STEP = 4
BUFFERED = ("--steps_per_generation", "2")
Final = tuple[dict[str, Any], list[dict[str, Any]]]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trl-generation-log")


def _clean(root: Path, job: str, *extra: str) -> Final:
    """A run nothing happens to: what a faulted run with the same arguments must end with."""
    run = LaunchedRun(root, job, extra=extra)
    try:
        run.start()
        assert run.finish() == 0, run.logs()
        assert [s for s, _ in run.steps()] == list(range(1, run.max_steps + 1))
        return run.final()
    finally:
        run.stop()


@pytest.fixture(scope="module")
def clean(root: Path) -> Final:
    return _clean(root, "clean")


@pytest.fixture(scope="module")
def clean_buffered(root: Path) -> Final:
    return _clean(root, "clean-buffered", *BUFFERED)


def _start(runs: list[LaunchedRun], root: Path, job: str, *extra: str) -> LaunchedRun:
    run = LaunchedRun(root, job, extra=extra)
    runs.append(run)
    run.start()
    return run


def _same_run(run: LaunchedRun, clean: Final) -> None:
    params, logged = run.final()
    want_params, want_logged = clean
    assert sorted(params) == sorted(want_params)
    different = [k for k in params if not torch.equal(params[k], want_params[k])]
    assert different == [], f"parameters differ from the clean run's: {different}"
    assert logged == want_logged
    assert [e["step"] for e in logged] == list(range(1, run.max_steps + 1))


def _wal(run: LaunchedRun) -> WriteAheadLog:
    return WriteAheadLog(rank_dir(run.run_dir / "generations", 0), sync=False)


def _entries(run: LaunchedRun) -> dict[str, tuple[WALStatus, str | None]]:
    wal = _wal(run)
    try:
        return {e.entry_id: (e.status, e.error) for e in wal.entries()}
    finally:
        wal.close()


def _generated_per_key(run: LaunchedRun) -> Counter[tuple[int, int]]:
    """How often each generation key was generated and logged (compaction drops COMPLETED
    entries, not the -r<n> attempts that a redone generation leaves beside a FAILED one)."""
    keys = Counter[tuple[int, int]]()
    for eid in _entries(run):
        parsed = parse_entry_id(eid)
        assert parsed is not None, eid
        keys[parsed[:2]] += 1
    return keys


def test_kill_9_after_a_generation_was_logged_reuses_it(
    root: Path, runs: list[LaunchedRun], clean: Final
) -> None:
    run = _start(runs, root, "kill-logged", "--kill_at", f"generation_logged:{KILL_STEP}")
    run.wait_exits(1)
    logged = _entries(run)[f"gen-{KILL_STEP:08d}-000"]
    assert logged[0] is WALStatus.PENDING  # durable, its step not committed
    run.restart()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean)
    steps = run.steps()
    assert [s for s, _ in steps] == list(range(1, run.max_steps + 1))
    pids = list(dict.fromkeys(pid for _, pid in steps))
    assert len(pids) == 2 and min(s for s, pid in steps if pid == pids[1]) == KILL_STEP
    assert run.events("generation_redone") == []  # generations redone: 0
    reused = run.events("generation_reused")
    assert [(e["step"], e["index"], e["buffered"]) for e in reused] == [(KILL_STEP, 0, False)]
    assert reused[0]["pid"] == pids[1]
    assert all(n == 1 for n in _generated_per_key(run).values())
    assert f"reused the logged generation of step {KILL_STEP}" in run.trainer_log()
    # Every generation's step is committed by the end of the run.
    assert all(status is WALStatus.COMPLETED for status, _ in _entries(run).values())


def test_the_buffered_generation_survives_a_kill_inside_its_span(
    root: Path, runs: list[LaunchedRun], clean_buffered: Final
) -> None:
    # One generation per two optimizer steps: step 3 generates for steps 3 and 4, and the kill
    # in step 4's backward pass loses TRL's buffer; the resume from step 3 rebuilds it.
    run = _start(runs, root, "kill-buffered", *BUFFERED, "--kill_at", f"backward:{KILL_STEP}")
    run.wait_exits(1)
    run.restart()
    assert run.finish() == 0, run.logs()
    _same_run(run, clean_buffered)
    assert f"resuming from the snapshot of step {KILL_STEP - 1}" in run.trainer_log()
    assert run.events("generation_redone") == []
    reused = run.events("generation_reused")
    assert [(e["step"], e["buffered"]) for e in reused] == [(KILL_STEP - 1, True)]
    assert sorted(_generated_per_key(run)) == [(1, 0), (3, 0), (5, 0)]
    assert all(n == 1 for n in _generated_per_key(run).values())


def test_a_logged_batch_whose_data_fails_its_checksum_is_generated_again(
    root: Path, runs: list[LaunchedRun], clean: Final
) -> None:
    run = _start(runs, root, "kill-damaged", "--kill_at", f"generation_logged:{KILL_STEP}")
    run.wait_exits(1)
    wal = _wal(run)
    try:
        entry = wal.get(f"gen-{KILL_STEP:08d}-000")
    finally:
        wal.close()
    assert entry is not None and entry.data_path is not None
    data = entry.data_path.read_bytes()
    entry.data_path.write_bytes(data[: len(data) // 2])  # torn by the kill, say
    run.restart()
    assert run.finish() == 0, run.logs()
    # Generated again from the same committed state: the run still matches the clean one.
    _same_run(run, clean)
    assert run.events("generation_reused") == []
    redone = run.events("generation_redone")
    assert [(e["step"], e["index"]) for e in redone] == [(KILL_STEP, 0)]
    assert "does not verify" in redone[0]["reason"] and "checksum" in redone[0]["reason"]
    entries = _entries(run)
    failed = entries[f"gen-{KILL_STEP:08d}-000"]
    assert failed[0] is WALStatus.FAILED and "checksum" in (failed[1] or "")
    assert entries[f"gen-{KILL_STEP:08d}-000-r1"][0] is WALStatus.COMPLETED


def test_a_generation_log_directory_that_is_a_file_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "generations").mkdir(parents=True)
    (run_dir / "generations" / "rank-0").write_text("not a directory", encoding="utf-8")
    env = {**os.environ, "RLGUARD_RUN_DIR": str(run_dir)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--output_dir", str(tmp_path / "out"), "--max_steps", "2",
         "--size", "tiny", "--snapshots", "on", "--rlguard", "off"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    wanted = f"the generation log directory {run_dir / 'generations' / 'rank-0'} is not a dir"
    assert wanted in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "out" / "steps.jsonl").exists()  # nothing trained
