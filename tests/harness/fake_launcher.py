"""A launcher hook for tests: logs each call as a JSON line; idempotent per idempotency key.

Env: RLGUARD_TEST_LAUNCHER_LOG (the log file), RLGUARD_TEST_LAUNCHER_SLEEP ("action=seconds"),
RLGUARD_TEST_LAUNCHER_FAIL (comma-separated actions that exit 3).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    action, args = sys.argv[1], sys.argv[2:]
    # The server passes every value joined to its option (``--job=VALUE``, one element); a
    # separate value would be a regression that lets ``-h`` or ``--run-root=/x`` pass as options.
    loose = [a for a in args if not (a.startswith("--") and "=" in a)]
    if loose:
        print(
            f"fake launcher: expected only --option=value arguments, got {loose!r}", file=sys.stderr
        )
        return 2
    opts = dict(a.split("=", 1) for a in args)
    log = Path(os.environ["RLGUARD_TEST_LAUNCHER_LOG"])
    key = opts.get("--idempotency-key", "")
    done_marker = log.with_name(f"done-{key.replace('/', '_')}")
    if done_marker.exists():
        return 0  # a real launcher also refuses to restart the same thing twice
    with log.open("a") as fh:
        fh.write(
            json.dumps({"event": "start", "action": action, "opts": opts, "pid": os.getpid()})
            + "\n"
        )
    sleep = dict(
        s.split("=")
        for s in filter(None, os.environ.get("RLGUARD_TEST_LAUNCHER_SLEEP", "").split(","))
    )
    if action in sleep:
        time.sleep(float(sleep[action]))
    if action in os.environ.get("RLGUARD_TEST_LAUNCHER_FAIL", "").split(","):
        print("launcher refuses", file=sys.stderr)
        return 3
    done_marker.touch()
    with log.open("a") as fh:
        fh.write(json.dumps({"event": "done", "action": action, "opts": opts}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
