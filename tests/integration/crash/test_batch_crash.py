"""kill -9 a worker that commits rollout batches; a reader never sees a partial batch."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from recovery.batch import cleanup_uncommitted, commit_batch, committed_batches

from ._harness import Reporter, assert_killed, run_and_kill

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def _samples_for(batch_id: str) -> list[dict[str, object]]:
    n = 1 + sum(batch_id.encode()) % 9
    return [{"id": f"{batch_id}/{i}", "response": batch_id * 200, "reward": i} for i in range(n)]


def _committer(root: Path, seed: int) -> Callable[[Reporter], None]:
    def child(report: Reporter) -> None:
        for n in range(10_000):
            batch_id = f"b{seed:03d}-{n:04d}"
            report.begin(batch_id)
            commit_batch(
                root,
                batch_id,
                _samples_for(batch_id),
                meta={"worker_id": f"w{seed}", "seed": seed, "token_count": n},
            )
            report.ack(batch_id)

    return child


def _check_all_complete(root: Path, checked: set[str]) -> None:
    """Every listed batch is whole; the samples of those in ``checked`` were compared before
    (listing still verifies every batch's files against its meta)."""
    for batch in committed_batches(root):
        if batch.batch_id not in checked:
            assert batch.load_samples() == _samples_for(batch.batch_id), batch.batch_id
            checked.add(batch.batch_id)


def _reader_during_commits(root: Path, seen: set[str]) -> None:
    """A concurrent reader: every batch it is shown must be whole (checked once per batch)."""
    for batch in committed_batches(root):
        if batch.batch_id not in seen:
            assert batch.load_samples() == _samples_for(batch.batch_id), batch.batch_id
            seen.add(batch.batch_id)
    time.sleep(0.002)


def test_batch_writer_killed_50_times(tmp_path: Path) -> None:
    rng = random.Random(99)
    acked: set[str] = set()
    landed_in_flight: set[str] = set()
    seen_live: set[str] = set()
    checked: set[str] = set()
    for kill in range(50):
        run = run_and_kill(
            _committer(tmp_path, kill),
            kill_after=rng.uniform(0.01, 0.15),  # a commit is ~6 fsyncs
            while_running=lambda: _reader_during_commits(tmp_path, seen_live),
            from_first_report=kill % 10 != 0,  # every 10th kill may land during start-up
        )
        assert_killed(run)
        acked.update(run.acked)
        listed = {b.batch_id for b in committed_batches(tmp_path)}
        assert acked <= listed, f"acknowledged batches missing: {acked - listed}"
        if run.in_flight in listed:
            landed_in_flight.add(run.in_flight)
        assert listed <= acked | landed_in_flight, f"batches nobody committed: {listed - acked}"
        _check_all_complete(tmp_path, checked)
        cleanup_uncommitted(tmp_path)
        leftovers = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
        assert not leftovers
        assert {b.batch_id for b in committed_batches(tmp_path)} == listed
        assert all((tmp_path / n / "SUCCESS").exists() for n in os.listdir(tmp_path) if n[0] == "b")
    _check_all_complete(tmp_path, set())  # no later kill or cleanup damaged an earlier batch
    # not vacuous: most children got batches committed before they were killed
    assert len(acked) > 20, f"too few batches committed before the kills: {len(acked)}"
    assert seen_live, "the concurrent reader never saw a batch"
