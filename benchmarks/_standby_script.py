"""The training script the standby benchmark restarts: it imports the heavy modules a GRPO
script imports (torch, transformers, trl, whichever are installed), then reports phase TRAIN and
a step every 0.1 s until ``<run_dir>/stop`` exists. Nothing else: what a restart costs before
the first step is what is measured."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

for name in ("torch", "transformers", "trl"):
    if importlib.util.find_spec(name) is not None:
        __import__(name)

from recovery.report import HeartbeatReporter  # noqa: E402

run_dir = Path(os.environ["RLGUARD_RUN_DIR"])
beat = HeartbeatReporter(
    run_dir,
    os.environ["RLGUARD_ROLE"],
    int(os.environ["RANK"]),
    job=os.environ["RLGUARD_JOB"],
    interval=0.1,
)
step = 0
while not (run_dir / "stop").exists():
    beat.update(phase="TRAIN", step=step, force=step == 0)
    time.sleep(0.1)
    step += 1
beat.update(phase="DONE", force=True)
