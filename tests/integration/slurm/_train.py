"""A small training script for the Slurm end-to-end test, run by ``rlguard launch`` inside a
Slurm batch job; it uses only the heartbeat API.

Each start is recorded in ``<run_dir>/starts.jsonl`` (pid, ``SLURM_RESTART_COUNT``, the step it
resumed from). The first run of the batch job (``SLURM_RESTART_COUNT`` unset or 0) reaches step
1 and stays in it (a long first step: compiling, warming up) until it is killed. A requeued run
resumes after the last step in ``<run_dir>/progress``, trains a step every 0.2 s until
``<run_dir>/stop`` exists, and exits 0 with phase DONE.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from recovery.report import HeartbeatReporter


def main() -> int:
    run_dir = Path(os.environ["RLGUARD_RUN_DIR"])
    restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    progress = run_dir / "progress"
    step = int(progress.read_text()) if progress.exists() else 0
    with open(run_dir / "starts.jsonl", "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "restarts": restarts, "from_step": step}) + "\n")
    beat = HeartbeatReporter(
        run_dir,
        os.environ["RLGUARD_ROLE"],
        int(os.environ["RANK"]),
        job=os.environ["RLGUARD_JOB"],
        interval=0.2,
    )
    beat.start_keepalive()
    stop = run_dir / "stop"
    while not stop.exists():
        if restarts == 0 and step >= 1:
            beat.update(phase="TRAIN", step=step)  # the long first step: killed in it
            time.sleep(0.2)
            continue
        step += 1
        beat.update(phase="TRAIN", step=step)
        progress.write_text(str(step))
        time.sleep(0.2)
    beat.update(phase="DONE", step=step, force=True)
    beat.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
