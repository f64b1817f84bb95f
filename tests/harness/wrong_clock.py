"""Run a Python module on a wall clock that is off: a node whose NTP is broken.

    python -m tests.harness.wrong_clock SECONDS_BEHIND -m MODULE [ARGS...]

``time.time`` and ``time.time_ns`` of this process return the true time less SECONDS_BEHIND
(negative: ahead), from before the module is imported, so every stamp it makes (and every
default ``clock=time.time`` it binds) is on that clock. Monotonic time and sleeping are left
alone, as a wrong NTP leaves them. (libfaketime does the same from outside, but its
interposed ``clock_nanosleep`` fails Python's ``time.sleep`` with EINVAL, or hangs it.)
"""

from __future__ import annotations

import runpy
import sys
import time


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        raise SystemExit("usage: python -m tests.harness.wrong_clock SECONDS -m MODULE [ARGS...]")
    behind = float(sys.argv[1])
    true_time, true_time_ns = time.time, time.time_ns
    time.time = lambda: true_time() - behind  # type: ignore[assignment]
    time.time_ns = lambda: true_time_ns() - int(behind * 1e9)  # type: ignore[assignment]
    module = sys.argv[3]
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
