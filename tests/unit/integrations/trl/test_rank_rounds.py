"""Several ranks, one consistent step (issue 39 item 2) without a trainer run: the commit rule
(:func:`integrations.snapshot_rounds.consistent_step`), the launcher's real checkpoint
coordinator running two-phase rounds with two real rank participants over HTTP (a step is
committed only when both answered done; a rank gone after its own snapshot leaves the step
uncommitted), the resume step computed from real memory snapshots, and two ranks writing one
resume directory."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from integrations.snapshot_owner import SnapshotOwner, rank_dir, start_for_launch
from integrations.snapshot_rounds import SnapshotRounds, consistent_step
from integrations.trl import snapshots
from integrations.trl.rank_rounds import RankRounds
from recovery.checkpoint.memory_snapshots import MemorySnapshotWriter
from recovery.checkpoint.version import VersionVector

pytestmark = pytest.mark.timeout(60)


# ---- the commit rule ---------------------------------------------------------------------------


def test_the_committed_step_is_resumed_when_every_rank_holds_it() -> None:
    assert consistent_step(5, {0: {3, 4, 5}, 1: {4, 5}}, [0, 1]) == 5


def test_a_step_missing_on_one_rank_is_never_resumed_from() -> None:
    # Rank 1 was killed before its snapshot of step 5 verified: both go back to step 4.
    assert consistent_step(5, {0: {3, 4, 5}, 1: {3, 4}}, [0, 1]) == 4
    # A step only one rank ever held, with nothing older in common: nothing to resume from.
    assert consistent_step(5, {0: {5}, 1: {4}}, [0, 1]) is None
    assert consistent_step(5, {0: {4, 5}}, [0, 1]) is None  # rank 1 holds nothing at all


def test_a_step_no_round_committed_is_never_resumed_from() -> None:
    # Both ranks hold step 6, but its round never committed (a rank died before answering).
    assert consistent_step(5, {0: {4, 5, 6}, 1: {4, 5, 6}}, [0, 1]) == 5
    assert consistent_step(None, {0: {1, 2}, 1: {1, 2}}, [0, 1]) is None


# ---- the real coordinator and two rank participants ----------------------------------------------


def _commit_together(ranks: list[RankRounds], step: int) -> list[object]:
    results: list[object] = [None] * len(ranks)

    def one(i: int) -> None:
        results[i] = ranks[i].commit(step)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_a_round_commits_a_step_only_when_every_rank_holds_it(tmp_path: Path) -> None:
    rounds = SnapshotRounds(tmp_path, [0, 1], round_timeout=1.0)
    rounds.start()
    held: dict[int, set[int]] = {0: set(), 1: set()}
    ranks = [
        RankRounds(r, rounds.url, step=0, holds=held[r].__contains__, wait=2.0) for r in (0, 1)
    ]
    try:
        for step in (1, 2):
            held[0].add(step)
            held[1].add(step)
            results = _commit_together(ranks, step)
            assert all(getattr(res, "committed", False) for res in results), results
            assert rounds.committed_step() == step
        # Step 3: rank 1 answers ready but does not hold its snapshot (its save failed): the
        # round aborts and step 3 is not committed, though rank 0 holds it.
        held[0].add(3)
        results = _commit_together(ranks, 3)
        assert not any(getattr(res, "committed", False) for res in results), results
        assert rounds.committed_step() == 2
        state = json.loads((tmp_path / "snapshot-rounds.json").read_text())
        assert state["global_version"] == {"training_step": 2, "inference_version": 2}
        # Rank 1 is killed after its own snapshot of step 4, before its round: rank 0 waits
        # in vain, and step 4 is never committed.
        ranks[1].close()
        held[0].add(4)
        held[1].add(4)
        result = ranks[0].commit(4)
        assert result is None or not result.committed
        assert rounds.committed_step() == 2
    finally:
        for r in ranks:
            r.close()
        rounds.close()


def _components(step: int, rank: int) -> dict[str, object]:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": pickle.dumps(scheduler.state_dict()),
        "scaler": None,
        "rng": pickle.dumps({"python": None, "numpy": None, "cpu": torch.tensor([rank])}),
        "rng_file": snapshots.rng_file_name(2, rank),
        "trainer_state": f'{{"global_step": {step}}}\n',
        "step": step,
    }


def test_restart_resumes_every_rank_from_the_committed_step_they_all_hold(
    tmp_path: Path,
) -> None:
    owner = SnapshotOwner("job", tmp_path / "run", [0, 1], shm_base=tmp_path / "shm")
    owner.start()
    try:
        assert owner.rounds is not None
        # Rank 0 holds steps 1-3, rank 1 steps 1-2 and a torn copy of 3 (no marker).
        for rank, steps in ((0, (1, 2, 3)), (1, (1, 2))):
            writer = MemorySnapshotWriter(rank_dir(owner.root, rank))
            for step in steps:
                writer.save(_components(step, rank), version=VersionVector(step, step))
            writer.close()
        torn = rank_dir(owner.root, 1) / ".tmp-torn"
        torn.mkdir()
        # The last round that committed was step 2's.
        owner.rounds.adopt(2)
        assert owner.newest_step(0) == 3  # what one rank alone would have resumed from
        assert owner.resume_step() == 2
        # Even a committed 3 is not resumed from while rank 1 lacks it.
        owner.rounds.adopt(3)
        assert owner.resume_step() == 2
    finally:
        owner.close()


def test_two_ranks_write_one_resume_directory(tmp_path: Path) -> None:
    memory = {r: tmp_path / "shm" / f"rank-{r}" for r in (0, 1)}
    for rank, root in memory.items():
        MemorySnapshotWriter(root).save(_components(2, rank), version=VersionVector(2, 2))
    (tmp_path / "out").mkdir()
    target = snapshots.resume_dir(tmp_path / "out", 2)
    for root in memory.values():
        assert snapshots.materialize_resume(target, [root], shared=True) == target
    assert (target / "rng_state_0.pth").exists() and (target / "rng_state_1.pth").exists()
    for rank in (0, 1):
        rng = torch.load(target / f"rng_state_{rank}.pth", weights_only=False)
        assert torch.equal(rng["cpu"], torch.tensor([rank]))
    assert (target / "model.safetensors").exists() and (target / "optimizer.pt").exists()
    assert not any(p.name.startswith(".tmp") for p in target.parent.iterdir())


def test_a_launch_of_some_ranks_of_a_larger_world_keeps_no_memory_snapshots(
    tmp_path: Path,
) -> None:
    # One rlguard launch per rank under torchrun: no coordinator spans the ranks, so a restart
    # must not resume one rank from its own newest snapshot while another uses checkpoint-N.
    trl_like = SimpleNamespace(memory_snapshots=True)
    assert start_for_launch(trl_like, "job", tmp_path / "run", [1], world_size=2) is None
