"""A participant's side of a node for the live tests: it writes its heartbeat the way a job's
``HeartbeatReporter`` does, every 0.25 s, on this process's own wall clock (which a test may
put off: ``tests.harness.stack.clock_behind_env``), until it is killed.

    python -m tests.integration.policy._job_on_node RUN_DIR JOB ROLE RANK
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from recovery.report import HeartbeatReporter


def main(run_dir: str, job: str, role: str, rank: str) -> None:
    reporter = HeartbeatReporter(Path(run_dir), role, int(rank), job=job, interval=0.25)
    step, tokens = 10, 0
    while True:
        if role == "rollout":
            tokens += 250  # ~1,000 tokens/s
            reporter.update(phase="ROLLOUT", step=step, tokens=tokens, pending=1, scheduled=8)
        else:
            step += 1
            reporter.update(phase="TRAIN", step=step)
        time.sleep(0.25)


if __name__ == "__main__":
    main(*sys.argv[1:5])
