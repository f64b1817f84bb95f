"""Trainer and rollout processes of a tiny job wired to the coordinator, for the recovery test.

``python -m tests.integration.checkpoint._job_proc trainer URL RUN_DIR`` trains a small torch
model (one step every ~20 ms), pushes weights every 3 steps (``RUN_DIR/push.json`` plus the
WeightVersionTable), keeps within the staleness bound, and saves a checkpoint (core + aux +
transient) on every committed round. ``... rollout URL RUN_DIR`` follows the pushed weights a
little late. Both print ``url <callback url>`` when serving and run until killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from recovery.checkpoint.participant import Participant
from recovery.checkpoint.version import VersionVector, WeightVersionTable

PUSH_EVERY = 3


def _write_json(path: Path, body: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def trainer(url: str, run_dir: Path) -> None:
    # Imported here so the rollout process starts without paying for torch.
    import torch

    from recovery.checkpoint.engine import CheckpointEngine
    from tests.integration.checkpoint._torch_job import build, train_step

    torch.set_num_threads(1)
    model, opt, sched = build()
    table = WeightVersionTable()
    engine = CheckpointEngine(run_dir / "ckpt", keep=3)
    step = 0
    version = VersionVector(0, 0)

    def on_commit(round_id: int, target: VersionVector) -> dict[str, Any]:
        assert target == version, (target, version)  # frozen at a safe point: nothing moved
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(),
            "step": step,
            "inference_weight_version": version.inference_version,
            "generation_config": {"temperature": 0.9},
            "experience_buffer": {"policy_version": [version.inference_version] * 4},
            "kv_cache": torch.zeros(8),
        }
        info = engine.save(state, version=target, weight_versions=table).wait(30)
        return {"path": str(info.path), "seq": info.seq}

    p = Participant("trainer", "trainer", [url], version=version, on_commit=on_commit,
                    heartbeat_interval=0.1, request_timeout=1.0)  # fmt: skip
    p.start()
    print(f"url {p.url}", flush=True)
    while True:
        p.wait_until_allowed(timeout=60, poll=0.05)
        step += 1
        train_step(model, opt, sched, step)
        if step % PUSH_EVERY == 0:
            table.record(step, step // PUSH_EVERY)
            _write_json(run_dir / "push.json", {"step": step, "version": step // PUSH_EVERY})
        version = VersionVector(step, table.version_at_step(step) or 0)
        p.set_version(version)
        p.heartbeat_now()
        p.safe_point(timeout=20)
        time.sleep(0.02)


def rollout(url: str, run_dir: Path) -> None:
    p = Participant("rollout", "rollout", [url], version=VersionVector(0, 0),
                    heartbeat_interval=0.1, request_timeout=1.0)  # fmt: skip
    p.start()
    print(f"url {p.url}", flush=True)
    while True:
        try:
            push = json.loads((run_dir / "push.json").read_text())
        except FileNotFoundError:
            push = None
        if push is not None and push["version"] > p.version.inference_version:
            time.sleep(0.05)  # pulling the weights takes a moment
            p.set_version(VersionVector(push["step"], push["version"]))
            p.heartbeat_now()
        p.safe_point(timeout=20)
        time.sleep(0.02)


if __name__ == "__main__":
    role, url, run_dir = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    (trainer if role == "trainer" else rollout)(url, run_dir)
