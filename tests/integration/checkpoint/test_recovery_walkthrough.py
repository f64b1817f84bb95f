"""The whole recovery path with real processes: a trainer and a rollout under a coordinator whose
lease is in real Redis; rounds trigger on the step interval while the staleness bound holds; the
trainer is killed -9 and confirmed failed; restore picks the checkpoint of the last committed
round, plans rollback/restore per participant, and the state loads into a fresh model."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from recovery.checkpoint.coordinator import Coordinator, RoundOutcome
from recovery.checkpoint.detector import HealthChange
from recovery.checkpoint.engine import CheckpointEngine
from recovery.checkpoint.lease import RedisLease
from recovery.checkpoint.restore import restore
from recovery.checkpoint.version import VersionVector
from tests.harness import wait_for
from tests.integration.checkpoint._lease import drop_redis_lease_keys
from tests.integration.checkpoint._torch_job import build

from .procs import Procs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


def test_rounds_crash_confirm_restore(redis_url: str, procs: Procs, tmp_path: Path) -> None:
    outcomes: list[RoundOutcome] = []
    changes: list[HealthChange] = []
    staleness_seen: list[int] = []
    name = f"walk-{uuid.uuid4().hex[:8]}"
    lease = RedisLease(redis_url, name=name, ttl=2.0, timeout=0.5)
    coord = Coordinator(
        coordinator_id="c1", lease=lease, round_timeout=3.0, request_timeout=1.0,
        checkpoint_interval_steps=12, max_staleness=5, suspect_after=0.6, confirm_after=1.0,
        on_round=outcomes.append, on_health_change=changes.append,
    )  # fmt: skip
    coord.start()
    try:
        procs.spawn("tests.integration.checkpoint._job_proc", "rollout", coord.url, str(tmp_path))
        trainer, _ = procs.spawn(
            "tests.integration.checkpoint._job_proc", "trainer", coord.url, str(tmp_path)
        )

        def committed() -> list[RoundOutcome]:
            status = coord.status()["participants"]
            if "trainer" in status and "rollout" in status:
                t, r = status["trainer"]["version"], status["rollout"]["version"]
                staleness_seen.append(t["training_step"] - r["training_step"])
            return [o for o in outcomes if o.committed]

        wait_for(lambda: len(committed()) >= 2, timeout=60, what="two committed rounds")
        procs.kill(trainer)
        wait_for(
            lambda: any(c.name == "trainer" and c.new.value == "failed" for c in changes),
            what="trainer confirmed failed",
        )
        global_version = coord.global_version
        assert global_version is not None
        steps = [0] + [o.global_version.training_step for o in committed() if o.global_version]
        # Each round was triggered by 12 more trainer steps (it lands a little later, at the
        # next safe point on a sync boundary).
        assert all(b - a >= 12 for a, b in zip(steps, steps[1:], strict=False)), steps
        assert global_version.training_step == steps[-1]
        assert lease.read_state()["global_version"] == global_version.as_json()
        status = coord.status()["participants"]
        trainer_now = VersionVector.from_json(status["trainer"]["version"])
        rollout_now = VersionVector.from_json(status["rollout"]["version"])
    finally:
        coord.close()
        lease.close()
        drop_redis_lease_keys(redis_url, name)

    # Rounds landed on sync boundaries and the trainer was held within the staleness bound
    # (the status is sampled between heartbeats, so allow one step of lag in the observation).
    assert all(o.global_version is not None for o in committed())
    assert max(staleness_seen) <= 5 + 1, max(staleness_seen)

    result = restore(
        CheckpointEngine(tmp_path / "ckpt"),
        participants={"trainer": trainer_now, "rollout": rollout_now},
        committed_version=global_version,
    )
    assert result.target == global_version
    assert result.action_for("trainer") in ("rollback", "keep")
    assert trainer_now.training_step >= global_version.training_step
    assert "kv_cache" in result.transient_to_clear
    assert result.state["step"] == global_version.training_step
    assert result.checkpoint.weight_versions.version_at_step(global_version.training_step) == (
        global_version.inference_version
    )
    model, opt, _ = build()
    model.load_state_dict(result.state["model"])
    opt.load_state_dict(result.state["optimizer"])
    assert int(opt.state_dict()["state"][0]["step"].item()) == global_version.training_step
    assert torch.isfinite(next(model.parameters())).all()
