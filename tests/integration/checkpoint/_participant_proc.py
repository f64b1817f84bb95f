"""A participant process for the coordinator tests.

Usage: ``python -m tests.integration.checkpoint._participant_proc NAME ROLE URLS STEP WEIGHTS MODE
LOG [CKPT_ROOT]``. Prints ``url <callback url>`` once serving. Its loop does a short "step" and
then calls ``safe_point``; every round result is appended to LOG as a JSON line, and the step
count is written to LOG.steps now and then. MODE: ``normal``; ``hang`` (stuck inside a step:
heartbeats go on but no safe point is ever reached); ``slow_save`` (the save takes 60 s).
With CKPT_ROOT the commit saves a small real checkpoint with the CheckpointEngine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from recovery.checkpoint.participant import Participant
from recovery.checkpoint.version import VersionVector


def main() -> None:
    name, role, urls, step, weights, mode, log = sys.argv[1:8]
    ckpt_root = sys.argv[8] if len(sys.argv) > 8 else None
    log_path = Path(log)
    engine: Any = None
    if ckpt_root:
        import torch

        from recovery.checkpoint.engine import CheckpointEngine

        engine = CheckpointEngine(ckpt_root, keep=5)

    def on_commit(round_id: int, target: VersionVector) -> dict[str, Any] | None:
        with open(log_path, "a") as fh:
            fh.write(json.dumps({"event": "saving", "round_id": round_id}) + "\n")
        if mode == "slow_save":
            time.sleep(60)
        if engine is None:
            return None
        state = {
            "model": {"w": torch.full((4, 4), float(target.training_step))},
            "optimizer": {"state": {}, "param_groups": []},
            "lr_scheduler": {},
            "step": target.training_step,
            "inference_weight_version": target.inference_version,
            "generation_config": {"temperature": 1.0},
        }
        info = engine.save(state, version=target).wait(30)
        return {"path": str(info.path)}

    p = Participant(
        name,
        role,
        urls.split(","),
        version=VersionVector(int(step), int(weights)),
        on_commit=on_commit,
        heartbeat_interval=0.2,
        request_timeout=1.0,
    )
    p.start()
    print(f"url {p.url}", flush=True)
    steps = 0
    while True:
        time.sleep(0.02)
        if mode == "hang":
            continue
        steps += 1
        if steps % 10 == 0:
            tmp = log_path.with_suffix(".tmp")
            tmp.write_text(str(steps))
            os.replace(tmp, log_path.with_suffix(".steps"))
        result = p.safe_point(timeout=20)
        if result is not None:
            gv = result.global_version
            line = {
                "event": "round",
                "round_id": result.round_id,
                "committed": result.committed,
                "global_version": None if gv is None else gv.as_json(),
                "reason": result.reason,
                "saved": result.saved,
            }
            with open(log_path, "a") as fh:
                fh.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
