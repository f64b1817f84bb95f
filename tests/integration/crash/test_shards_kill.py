"""Kill -9 a shard's snapshot writer at random moments; what survives must rebuild exactly."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recovery.shards import MARKER, BaseShard, ShardSnapshotter
from tests.harness import spawn

WRITER = r"""
import sys, torch
from pathlib import Path
from recovery.shards import ShardSnapshotter
from tests.integration.crash.test_shards_kill import base, params_at
snapshots = ShardSnapshotter(Path(sys.argv[1]), snapshot_interval_steps=1, keep=3)
step = int(sys.argv[2])
while True:
    snapshots.snapshot("actor-0", step, params_at(step), {"step": torch.tensor(step)}, base())
    print(step, flush=True)
    step += 1
"""


def base() -> BaseShard:
    gen = torch.Generator().manual_seed(11)
    return BaseShard(
        0,
        {
            "w": torch.randn(512, 1024, generator=gen),
            "b": torch.randn(1024, generator=gen).to(torch.bfloat16),
        },
    )


def params_at(step: int) -> dict[str, torch.Tensor]:
    b = base().params
    return {"w": b["w"] + step * 0.01, "b": b["b"] * (1 + step % 3)}


@pytest.mark.timeout(120)
def test_killed_writer_leaves_only_verifiable_snapshots_that_rebuild_exactly(
    tmp_path: Path,
) -> None:
    rng = random.Random(5)
    root = Path(__file__).resolve().parents[3]
    first_step = 1
    for _ in range(4):
        proc = spawn(
            [sys.executable, "-c", WRITER, str(tmp_path), str(first_step)],
            cwd=root,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            committed = int(proc.stdout.readline())  # at least one snapshot is durable
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()

        snapshots = ShardSnapshotter(tmp_path, snapshot_interval_steps=1, keep=3)
        latest = snapshots.latest("actor-0")
        assert latest is not None and latest.step >= committed
        rebuilt = snapshots.rebuild_shard("actor-0", load_base=lambda shard: base())
        assert rebuilt.step == latest.step
        expected = params_at(latest.step)
        for name, tensor in expected.items():
            assert torch.equal(rebuilt.params[name], tensor), name
        assert int(rebuilt.optimizer_state["step"]) == latest.step
        # Directories the kill left behind (temp dirs, a renamed dir without its marker) are
        # never taken for snapshots.
        for path in (tmp_path / "actor-0").iterdir():
            if (
                path.name.startswith("snap-")
                and path.name != latest.path.name
                and not (path / MARKER).exists()
            ):
                assert int(path.name[5:]) > latest.step
        first_step = latest.step + 1  # a restarted writer resumes after the last good snapshot
    # The next writer sweeps the temp directories a killed one left.
    ShardSnapshotter(tmp_path, snapshot_interval_steps=1).snapshot(
        "actor-0", first_step, params_at(first_step), {"step": torch.tensor(first_step)}, base()
    )
    assert not list((tmp_path / "actor-0").glob(".tmp-*"))
