"""A pre-imported process that forks checkpoint writers on command, so a test can kill -9 a
hundred real writers without paying torch's import time for each.

Protocol on stdin/stdout, one line each: ``fork <root> <first_step> direct|buffered`` →
``pid <pid>``;
``reap <pid>`` → ``reaped <pid> <raw wait status>``; ``exit``. The zygote itself runs no torch
op before forking, so the children start with clean thread pools.
"""

from __future__ import annotations

import os
import sys

import torch

from recovery.checkpoint.engine import CheckpointEngine
from tests.integration.checkpoint._kill_state import (
    make_state,
    table_of,
    version_of,
    writer_tensors,
)


def _writer(root: str, first_step: int, direct_io: bool) -> None:
    torch.set_num_threads(1)
    engine = CheckpointEngine(
        root, keep=3, when_busy="wait", direct_io=direct_io, mirror=f"{root}-mirror"
    )
    tensors = writer_tensors(first_step)
    step = first_step
    while True:
        state = make_state(step, tensors)
        engine.save(state, version=version_of(step), weight_versions=table_of(step))
        step += 1


def main() -> None:
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "fork":
            pid = os.fork()
            if pid == 0:
                try:
                    _writer(args[0], int(args[1]), args[2] == "direct")
                finally:
                    os._exit(3)
            print(f"pid {pid}", flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(f"reaped {args[0]} {status}", flush=True)
        elif cmd == "exit":
            return


if __name__ == "__main__":
    main()
