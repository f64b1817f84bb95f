"""integrations/trl/snapshots.py without a trainer run: a snapshot turned back into the Trainer's
checkpoint layout (real tensors, optimizer and scheduler, real files), the paths it leaves alone,
and the errors that name what is wrong."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from integrations import IntegrationError
from integrations.trl import snapshots
from integrations.trl.snapshots import materialize_resume, resume_dir
from recovery.checkpoint.memory_snapshots import MemorySnapshotWriter
from recovery.checkpoint.persister import SnapshotPersister
from recovery.checkpoint.version import VersionVector
from recovery.report import HeartbeatReporter

pytestmark = pytest.mark.timeout(60)


def _components(step: int) -> dict[str, object]:
    torch.manual_seed(step)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / 10)
    model(torch.randn(2, 8)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": pickle.dumps(scheduler.state_dict()),
        "scaler": None,
        "rng": pickle.dumps(snapshots.rng_states(False)),
        "rng_file": snapshots.rng_file_name(1, 0),
        "trainer_state": f'{{"global_step": {step}}}\n',
        "step": step,
    }


def test_a_snapshot_becomes_the_trainers_checkpoint_layout(tmp_path: Path) -> None:
    memory = tmp_path / "shm"
    writer = MemorySnapshotWriter(memory)
    for step in (1, 2):
        writer.save(_components(step), version=VersionVector(step, step))
    want = _components(2)
    target = resume_dir(tmp_path / "out", 2)
    (tmp_path / "out").mkdir()
    stale = resume_dir(tmp_path / "out", 1)
    stale.mkdir()
    assert materialize_resume(target, [tmp_path / "missing", memory]) == target
    assert not stale.exists()  # an older one of ours is removed
    weights = load_file(str(target / "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in want["model"].items())  # type: ignore[attr-defined]
    optimizer = torch.load(target / "optimizer.pt", weights_only=True)
    expected = want["optimizer"]
    assert torch.equal(
        optimizer["state"][0]["exp_avg"],
        expected["state"][0]["exp_avg"],  # type: ignore[index]
    )
    assert torch.load(target / "scheduler.pt", weights_only=False)["last_epoch"] == 1
    rng = torch.load(target / "rng_state.pth", weights_only=False)
    assert set(rng) >= {"python", "numpy", "cpu"}
    assert (target / "trainer_state.json").read_text() == want["trainer_state"]
    assert not (target / "scaler.pt").exists()


def test_a_path_that_names_no_snapshot_is_left_alone(tmp_path: Path) -> None:
    assert materialize_resume(tmp_path / "checkpoint-5", [tmp_path]) is None
    assert not (tmp_path / "checkpoint-5").exists()


def test_no_verifying_snapshot_of_the_step_is_an_error_naming_it(tmp_path: Path) -> None:
    memory = tmp_path / "shm"
    MemorySnapshotWriter(memory).save(_components(1), version=VersionVector(1, 1))
    with pytest.raises(IntegrationError, match=rf"no snapshot of step 3 verifies in {memory}"):
        materialize_resume(resume_dir(tmp_path, 3), [memory])


def test_an_unsupported_transformers_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots, "SNAPSHOT_TRANSFORMERS", ("9.0.0", "9.1"))
    with pytest.raises(IntegrationError, match=r"transformers 5\.\d+.*transformers>=9\.0\.0,<9\.1"):
        snapshots.check_snapshot_versions()


def test_persist_failures_of_the_launcher_are_snapshot_persist_errors(tmp_path: Path) -> None:
    """The launcher cannot persist the memory snapshots (the disk root is a file): the trainer
    counts each failure once as a snapshot persist error, with the directory and the error,
    and leaves the job's own checkpoint error counter (storage_unwritable) alone."""
    reporter = HeartbeatReporter(tmp_path / "run", "trainer", 0, interval=60)
    trainer = SimpleNamespace(
        callback_handler=SimpleNamespace(callbacks=[SimpleNamespace(reporter=reporter)])
    )
    snaps = snapshots.TrainerSnapshots(
        trainer,  # type: ignore[arg-type]  # only its callbacks are read here
        run_dir=tmp_path / "run",
        rank=0,
        segment=tmp_path / "shm",
    )
    assert snaps.memory is not None
    blocked = tmp_path / "disk"
    blocked.write_text("a file where the directory should be", encoding="utf-8")
    persister = SnapshotPersister([(snaps.memory.root, blocked)])
    for step in (1, 2):
        snaps.memory.save(_components(step), version=VersionVector(step, step))
        persister.persist_once()
    snaps._check_persist_status()
    snaps._check_persist_status()  # nothing new: not counted again
    doc = reporter.snapshot()
    assert doc["snapshot_persist_errors_total"] == 2
    assert doc["checkpoint_write_errors_total"] == 0
    last = doc["snapshot_persist_last_error"]
    assert last["dir"] == str(blocked) and last["error"].startswith("[Errno "), last
