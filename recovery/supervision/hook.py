"""The launcher hook's command line: what ``RLGUARD_RECOVERY_LAUNCHER`` runs.

``<hook> ACTION --job=J [--node=N] [--role=R] [--rank=K] [--away-from=N] --idempotency-key=KEY
[--extra=JSON] [--run-root=ROOT] [--wait=S]`` leaves the request for the launcher of
``<ROOT>/<J>`` (:func:`recovery.supervision.requests.submit`), waits for its answer and prints
it as one JSON line. Exit codes: 0 the launcher did it, 1 it refused (the answer says why),
2 bad arguments or no launcher running, 3 no answer within ``--wait``.

Two actions are the hook's own, answered on the node without the launcher (which may be stuck
or gone): ``withdraw`` gives up a request under ``--idempotency-key`` unless the launcher took
it already (:func:`recovery.supervision.requests.withdraw`; exit 0 withdrawn, 1 not: the
answer says whether it was carried out or is being carried out), and ``drill_figures``
counts the generations the job did again since ``--extra='{"since": EPOCH}'``
(:mod:`recovery.supervision.drill_figures`).

``rlguard launch`` and the reference job's ``python -m workload.launch`` both serve this one
protocol, so one hook executable serves every job on a node. How a request is spelt is
:mod:`recovery.protocol.hook_request`, which the server's action worker builds it with.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from recovery.protocol.hook_request import add_request_arguments
from recovery.supervision.drill_figures import figures_answer
from recovery.supervision.requests import (
    HOOK_ACTIONS,
    JOB_DIR_PATTERN,
    KEY_PATTERN,
    LauncherError,
    LauncherTimeout,
    submit,
    withdraw,
)

# Answered by the hook itself, on the node (see the module docstring).
LOCAL_ACTIONS = ("withdraw", "drill_figures")

ROLE_PATTERN = re.compile(r"[A-Za-z0-9_.]{1,64}")  # recovery.report's rule for heartbeat roles


def write_hook_script(path: Path, *, comment: str, command: str) -> None:
    """Write an executable shell script ``path`` that runs ``command`` (already quoted) with
    the hook's own arguments after it; ``comment`` says in the file what wrote it."""
    path.write_text(f'#!/bin/sh\n# {comment}\nexec {command} "$@"\n', encoding="utf-8")
    path.chmod(0o755)


def main(argv: list[str], *, prog: str, default_run_root: str | None) -> int:
    """Run the hook with ``argv`` (after the program name); the exit code."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("action")
    add_request_arguments(p)
    p.add_argument("--run-root", default=default_run_root)
    p.add_argument("--wait", type=float, default=60.0)
    args = p.parse_args(argv)
    if args.action not in (*HOOK_ACTIONS, *LOCAL_ACTIONS):
        p.error(
            f"action {args.action!r} is not one of {', '.join((*HOOK_ACTIONS, *LOCAL_ACTIONS))}"
        )
    if not JOB_DIR_PATTERN.fullmatch(args.job):
        p.error(f"--job {args.job!r} cannot name a run directory")
    if not KEY_PATTERN.fullmatch(args.idempotency_key):
        p.error(
            f"--idempotency-key {args.idempotency_key!r} must be 1-300 printable ASCII characters"
        )
    if args.rank is not None and not args.rank.isdigit():
        p.error(f"--rank must be a non-negative integer, got {args.rank!r}")
    if args.role is not None and not ROLE_PATTERN.fullmatch(args.role):
        p.error(f"--role {args.role!r} must be 1-64 of letters, digits, '_' and '.'")
    if not args.run_root:
        p.error("--run-root (or RLGUARD_RECOVERY_RUN_ROOT) is needed to find the job")
    extra = {}
    if args.extra:
        try:
            extra = json.loads(args.extra)
        except json.JSONDecodeError as exc:
            p.error(f"--extra is not JSON: {exc}")
    run_dir = Path(args.run_root) / args.job
    if args.action in LOCAL_ACTIONS:
        return _local(p, args.action, run_dir, args.idempotency_key, extra)
    body = {
        "action": args.action,
        "role": args.role,
        "rank": args.rank,
        "node": args.node,
        "away_from": args.away_from,
        "extra": extra,
    }
    try:
        answer = submit(run_dir, body, key=args.idempotency_key, timeout=args.wait)
    except LauncherTimeout as exc:
        sys.stderr.write(f"{exc}\n")
        return 3
    except LauncherError as exc:
        sys.stderr.write(f"no running job {args.job!r} under {args.run_root} ({exc})\n")
        return 2
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0 if answer.get("ok") else 1


def _local(p: argparse.ArgumentParser, action: str, run_dir: Path, key: str, extra: Any) -> int:
    if action == "withdraw":
        why = extra.get("why") if isinstance(extra, dict) else None
        answer = withdraw(run_dir, key, why=str(why or "withdrawn by its requester"))
        sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
        return 0 if answer["withdrawn"] else 1
    return answer_drill_figures(p, run_dir, extra)


def answer_drill_figures(p: argparse.ArgumentParser, run_dir: Path | None, extra: Any) -> int:
    """A hook's ``drill_figures`` (this one's and the Ray hook's): the count as one JSON line on
    stdout, the exit code; a bad ``--extra`` stops with the parser's error naming it."""
    try:
        answer = figures_answer(run_dir, extra)
    except ValueError as exc:
        p.error(str(exc))
    sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    return 0 if answer.get("ok") else 1


def write_hook(path: Path, *, module: str, run_root: Path, python: str = sys.executable) -> None:
    """Write an executable ``path`` that runs ``python -m MODULE hook --run-root ROOT ARGS``."""
    root = str(run_root.resolve())
    write_hook_script(
        path,
        comment=f"RLGuard launcher hook (written by {module})",
        command=f"{shlex.quote(python)} -m {module} hook --run-root {shlex.quote(root)}",
    )
