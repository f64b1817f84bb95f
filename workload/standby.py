"""A warm standby for one role of the reference job: ``python -m workload.standby --role R``.

Starting a role from scratch is mostly starting Python and importing torch: seconds on a busy
machine, every one of them on the recovery path. The launcher keeps one standby per role that
has already paid for that, blocked on its stdin. To replace a dead process the launcher writes
one order (a JSON line) to the standby's stdin::

    {"argv": ["--run-dir", "D", "--rank", "1"], "log": "D/logs/rollout-1.log"}

and the standby becomes that process: its output goes to the role's log and it runs the role's
``main`` with ``argv``, exactly what ``python -m workload.<role> ARGV`` would run. End of input
without an order (the launcher stopping) ends the standby. A bad order is refused on stderr
with exit code 2, and nothing is run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from recovery.supervision.standby import OrderError, redirect_output
from recovery.supervision.standby import parse_order as _parse_order

__all__ = ["ROLES", "OrderError", "main", "parse_order"]

ROLES = ("trainer", "rollout")
MODULES = ("workload.trainer", "workload.rollout", "workload.engines.trainer")


def parse_order(line: str) -> tuple[list[str], str]:
    """The order's ``argv`` and ``log``; :class:`OrderError` names what is wrong. The reference
    roles take no environment or directory of their own: an order with them is refused."""
    order = _parse_order(line)
    if order.env or order.cwd is not None:
        raise OrderError(f"the order must be an object with argv and log, got {line.strip()!r}")
    return order.argv, order.log


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload.standby")
    parser.add_argument("--role", required=True, choices=ROLES)
    parser.add_argument("--run-dir", help="where to record when the standby is ready")
    parser.add_argument(
        "--module",
        choices=MODULES,
        help="the role's module (default workload.ROLE; the vLLM job's trainer is another)",
    )
    args = parser.parse_args(argv)
    # The expensive part, done before anything is asked of us: torch and the role's code.
    module = importlib.import_module(args.module or f"workload.{args.role}")
    module.warm_up()
    if args.run_dir:
        from workload.job import RunDir

        RunDir(args.run_dir).event("standby_ready", role=args.role)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the launcher no longer needs us
    try:
        role_argv, log = parse_order(line)
    except OrderError as exc:
        print(f"standby {args.role}: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    redirect_output(log)
    code: int = module.main(role_argv)
    return code


if __name__ == "__main__":
    sys.exit(main())
