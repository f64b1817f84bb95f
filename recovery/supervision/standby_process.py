"""A warm standby process (see :mod:`recovery.supervision.standby`)::

    python -m recovery.supervision.standby_process --role trainer --preload torch,transformers

It imports the ``--preload`` modules, says ``standby_ready`` on the launcher's timeline, then
waits for one order on stdin and becomes the process it names.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from recovery.supervision.standby import OrderError, become, parse_order, python_target


def main(argv: list[str] | None = None) -> int:
    """``python -m recovery.supervision.standby_process --role R [--preload MOD,...] [--events PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m recovery.supervision.standby_process")
    parser.add_argument("--role", required=True)
    parser.add_argument("--preload", default="", help="modules to import now, comma-separated")
    parser.add_argument("--events", help="the launcher's events.jsonl, to say when ready")
    args = parser.parse_args(argv)
    # The expensive part, done before anything is asked of us.
    for name in filter(None, (m.strip() for m in args.preload.split(","))):
        importlib.import_module(name)
    if args.events:
        from recovery.supervision.events import append_event

        append_event(Path(args.events), "standby_ready", role=args.role, preload=args.preload)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the launcher no longer needs us
    try:
        order = parse_order(line)
        python_target(order.argv)
    except OrderError as exc:
        sys.stderr.write(f"standby {args.role}: {exc}\n")
        return 2
    return become(order)


if __name__ == "__main__":
    sys.exit(main())
