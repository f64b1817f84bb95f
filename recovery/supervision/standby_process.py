"""A warm standby process (see :mod:`recovery.supervision.standby`)::

    python -m recovery.supervision.standby_process --role trainer --preload torch,transformers

It imports the ``--preload`` modules, runs the ``--warmup`` functions (``MODULE:FUNCTION``, an
integration's: e.g. one throwaway training step that pays a fresh process's once-only costs, see
:mod:`integrations.trl.warmup`), says ``standby_ready`` on the launcher's timeline, then waits
for one order on stdin and becomes the process it names.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from recovery.supervision.standby import OrderError, become, parse_order, python_target


def run_warmup(spec: str) -> None:
    """Call ``MODULE:FUNCTION``. A warm-up that fails costs the restart its gain, not the
    standby: the failure is said on stderr (the standby's log) and the standby still serves."""
    module, _, function = spec.partition(":")
    try:
        getattr(importlib.import_module(module), function)()
    except Exception as exc:  # noqa: BLE001 - any failure only loses the warm-up
        sys.stderr.write(f"standby warm-up {spec} failed, skipped: {type(exc).__name__}: {exc}\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m recovery.supervision.standby_process --role R [--preload MOD,...] [--events PATH]``."""
    parser = argparse.ArgumentParser(prog="python -m recovery.supervision.standby_process")
    parser.add_argument("--role", required=True)
    parser.add_argument("--preload", default="", help="modules to import now, comma-separated")
    parser.add_argument(
        "--warmup", default="", help="MODULE:FUNCTION to call once imported, comma-separated"
    )
    parser.add_argument("--events", help="the launcher's events.jsonl, to say when ready")
    args = parser.parse_args(argv)
    # The expensive part, done before anything is asked of us.
    for name in filter(None, (m.strip() for m in args.preload.split(","))):
        importlib.import_module(name)
    for spec in filter(None, (w.strip() for w in args.warmup.split(","))):
        run_warmup(spec)
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
