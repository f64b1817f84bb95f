"""A training script under ``rlguard launch`` that hangs on request, in functions whose names the
hang-forensics test looks for in the captured stacks.

It trains (phase TRAIN, a step every 0.1 s) in ``train_forever``. When ``<run_dir>/spin``
appears it takes the file (one hang per request: its restart trains normally) and spins in
``spin_without_progress``: the CPU busy, the step frozen, the heartbeat kept fresh by the
reporter's keep-alive thread, which is what a rank stuck in a busy-waiting collective looks like.
A SIGSTOP from the test freezes it whole instead (heartbeat included).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from recovery.report import HeartbeatReporter


def spin_without_progress() -> None:
    x = 0
    while True:
        x += 1


def train_forever(run_dir: Path, beat: HeartbeatReporter) -> None:
    step = 0
    spin = run_dir / "spin"
    while not (run_dir / "stop").exists():
        beat.update(phase="TRAIN", step=step)
        if spin.exists():
            spin.unlink()
            spin_without_progress()
        time.sleep(0.1)
        step += 1


def main() -> None:
    run_dir = Path(os.environ["RLGUARD_RUN_DIR"])
    beat = HeartbeatReporter(
        run_dir,
        os.environ["RLGUARD_ROLE"],
        int(os.environ["RANK"]),
        job=os.environ["RLGUARD_JOB"],
        interval=0.2,
    )
    beat.start_keepalive()
    train_forever(run_dir, beat)
    beat.update(phase="DONE", force=True)
    beat.close()


if __name__ == "__main__":
    main()
