"""A generic training script under ``rlguard launch``: it uses only the heartbeat API.

It records what each start saw (argv, environment) in ``<run_dir>/starts-<rank>.jsonl``, then
"trains" (phase TRAIN, a step every 0.1 s) until ``<run_dir>/stop`` exists or ``--steps`` are
done, and exits 0 with phase DONE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from recovery.report import HeartbeatReporter

KEYS = (
    "RLGUARD_JOB",
    "RLGUARD_ROLE",
    "RLGUARD_RUN_DIR",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def main() -> int:
    run_dir = Path(os.environ["RLGUARD_RUN_DIR"])
    rank = int(os.environ["RANK"])
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 10**9
    with open(run_dir / f"starts-{rank}.jsonl", "a") as fh:
        fh.write(
            json.dumps(
                {
                    "argv": sys.argv[1:],
                    "pid": os.getpid(),
                    "env": {k: os.environ.get(k) for k in KEYS},
                }
            )
            + "\n"
        )
    beat = HeartbeatReporter(
        run_dir, os.environ["RLGUARD_ROLE"], rank, job=os.environ["RLGUARD_JOB"], interval=0.2
    )
    beat.start_keepalive()
    step = 0
    while step < steps and not (run_dir / "stop").exists():
        beat.update(phase="TRAIN", step=step)
        time.sleep(0.1)
        step += 1
    beat.update(phase="DONE", step=step, force=True)
    beat.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
