"""A training script under ``rlguard launch`` that fails the way real ones do.

It trains (heartbeat API: phase TRAIN, a step every 0.05 s) until step ``--at`` (default 5),
then, by ``--fail``:

* ``oom``: raises ``torch.cuda.OutOfMemoryError`` with PyTorch's own message (a CPU machine
  cannot run out of GPU memory; the exception type and text are PyTorch's);
* ``nccl``: prints the NCCL watchdog's line to stderr and aborts (SIGABRT), as
  ProcessGroupNCCL's watchdog does;
* ``sigkill``: kills itself with SIGKILL, printing nothing;
* ``caught-oom``: prints the OOM message, then exits 0 (an OOM it handled is not why it ended);
* ``none``: exits 0.

``--noise BYTES`` first writes that many bytes of ordinary log lines to stdout as fast as it can;
``--print-secret`` puts ``$HF_TOKEN`` into the fatal message (it must be redacted).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from recovery.report import HeartbeatReporter

OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
    "which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in "
    "use. Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.31 GiB is reserved by "
    "PyTorch but unallocated."
)
NCCL = (
    "[rank{rank}]:[E1205 20:41:07.112 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600047 milliseconds before timing out."
)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--fail", default="oom")
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--noise", type=int, default=0)
    p.add_argument("--print-secret", action="store_true")
    args = p.parse_args()
    run_dir = Path(os.environ["RLGUARD_RUN_DIR"])
    rank = int(os.environ["RANK"])
    beat = HeartbeatReporter(
        run_dir, os.environ["RLGUARD_ROLE"], rank, job=os.environ["RLGUARD_JOB"], interval=0.1
    )
    beat.start_keepalive()
    line = b"INFO step metrics: loss=0.4213 reward=0.118 kl=0.0021 lr=1e-06 tokens=65536\n"
    written = 0
    while written < args.noise:
        sys.stdout.buffer.write(line * 1000)
        written += len(line) * 1000
    sys.stdout.flush()
    for step in range(args.at):
        beat.update(phase="TRAIN", step=step)
        time.sleep(0.05)
    beat.update(phase="TRAIN", step=args.at, force=True)
    secret = f" (token {os.environ.get('HF_TOKEN', '')})" if args.print_secret else ""
    if args.fail == "oom":
        import torch

        raise torch.cuda.OutOfMemoryError(OOM + secret)
    if args.fail == "nccl":
        print(NCCL.format(rank=rank) + secret, file=sys.stderr, flush=True)
        os.abort()
    if args.fail == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if args.fail == "caught-oom":
        print(f"torch.OutOfMemoryError: {OOM} -- skipped the batch", flush=True)
    beat.update(phase="DONE", step=args.at, force=True)
    beat.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
