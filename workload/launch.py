"""Launch and supervise the reference GRPO job, and serve as RLGuard's launcher hook.

Run the job::

    python -m workload.launch --run-dir DIR --steps N [--rollouts 2] [--on-failure wait]

Launcher hook (what ``RLGUARD_RECOVERY_LAUNCHER`` points at; the recovery adapters call it as
``<hook> <action> --job J [--node N] [--role R] [--rank K] --idempotency-key K [--extra JSON]``)::

    python -m workload.launch hook restart_role --job J --role rollout --rank 1 --idempotency-key K
    python -m workload.launch write-hook PATH --run-root ROOT   # an executable wrapper for it

The hook leaves a request in ``<run_root>/<job>/recovery/launcher/`` and waits for the running
supervisor to answer it; a request with a key that was already answered is answered again
without acting (the adapters may retry).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from workload.job import JobConfig, JobConfigError, RunDir, read_json, write_json_atomic
from workload.task import TaskSpec

HOOK_ACTIONS = ("restart_role", "restart_job", "reschedule_batches", "restore_checkpoint")
_KEY = re.compile(r"^[\x21-\x7e]{1,300}$")  # printable ASCII, no spaces
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _supervise(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m workload.launch",
        description="Run the reference GRPO job (trainer + rollouts).",
    )
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--rollouts", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--job", default=None, help="job name (default: the run directory's name)")
    p.add_argument(
        "--decode-ms", type=float, default=15.0, help="simulated decode latency per token"
    )
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompts-per-worker", type=int, default=4)
    p.add_argument("--on-failure", choices=("wait", "restart-job"), default="wait")
    p.add_argument("--hang-timeout", type=float, default=10.0)
    p.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep a warm standby process per role for role-local restarts "
        "(default: on with --on-failure wait; not available with restart-job)",
    )
    p.add_argument("--timeout", type=float, default=None, help="give up after this many seconds")
    args = p.parse_args(argv)
    if args.standby and args.on_failure != "wait":
        p.error(
            "--standby is for --on-failure wait (the whole-job restart starts every process cold)"
        )
    standby = args.on_failure == "wait" if args.standby is None else args.standby
    run_dir = Path(args.run_dir).resolve()
    job = args.job or run_dir.name
    if not _JOB.fullmatch(job):
        p.error(f"--job {job!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    if args.group_size < 2:
        p.error(
            f"--group-size must be >= 2 (advantages are relative to the group), got {args.group_size}"
        )
    if args.prompts_per_worker < 1:
        p.error(f"--prompts-per-worker must be >= 1, got {args.prompts_per_worker}")
    try:
        config = JobConfig(
            job=job,
            steps=args.steps,
            rollouts=args.rollouts,
            seed=args.seed,
            decode_ms_per_token=args.decode_ms,
            task=TaskSpec(group_size=args.group_size, prompts_per_worker=args.prompts_per_worker),
        )
    except JobConfigError as exc:
        p.error(str(exc))
    logging.basicConfig(
        level=os.environ.get("RLGUARD_WORKLOAD_LOG", "WARNING"),
        format="%(asctime)s launch %(levelname)s %(name)s: %(message)s",
    )
    # Imported here: the hook and write-hook commands below must not pay for torch (the
    # recovery worker starts the hook for every action, on the recovery path).
    from workload.supervisor import Supervisor

    sup = Supervisor(
        RunDir(run_dir),
        config,
        on_failure=args.on_failure,
        hang_timeout=args.hang_timeout,
        timeout=args.timeout,
        standby=standby,
    )

    def on_signal(signum: int, _frame: object) -> None:
        sup.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sup.start()
        code = sup.loop()
    finally:
        sup.close()
    if code == 0:
        final = read_json(RunDir(run_dir).final) or {}
        print(json.dumps({"done": True, **final}))  # noqa: T201 - CLI output
    return code


def _hook(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m workload.launch hook")
    p.add_argument("action")
    p.add_argument("--job", required=True)
    p.add_argument("--node")
    p.add_argument("--role")
    p.add_argument("--rank")
    p.add_argument("--away-from")
    p.add_argument("--idempotency-key", required=True)
    p.add_argument("--extra")
    p.add_argument("--run-root", default=os.environ.get("RLGUARD_RECOVERY_RUN_ROOT"))
    p.add_argument("--wait", type=float, default=60.0)
    args = p.parse_args(argv)
    if args.action not in HOOK_ACTIONS:
        p.error(f"action {args.action!r} is not one of {', '.join(HOOK_ACTIONS)}")
    if not _JOB.fullmatch(args.job):
        p.error(f"--job {args.job!r} cannot name a run directory")
    if not _KEY.fullmatch(args.idempotency_key):
        p.error(
            f"--idempotency-key {args.idempotency_key!r} must be 1-300 printable ASCII characters"
        )
    if args.rank is not None and not args.rank.isdigit():
        p.error(f"--rank must be a non-negative integer, got {args.rank!r}")
    if args.role is not None and args.role not in ("trainer", "rollout"):
        p.error(f"--role must be trainer or rollout, got {args.role!r}")
    if not args.run_root:
        p.error("--run-root (or RLGUARD_RECOVERY_RUN_ROOT) is needed to find the job")
    extra = {}
    if args.extra:
        try:
            extra = json.loads(args.extra)
        except json.JSONDecodeError as exc:
            p.error(f"--extra is not JSON: {exc}")
    run = RunDir(Path(args.run_root) / args.job)
    runtime = read_json(run.runtime)
    if runtime is None:
        print(f"no running job {args.job!r} under {args.run_root}", file=sys.stderr)  # noqa: T201
        return 2
    # Keys carry '/' and ':' (inc2/s0/restart_job:job): a digest makes a safe, stable file name.
    name = hashlib.sha256(args.idempotency_key.encode()).hexdigest()[:32]
    req, done = run.launcher_requests / f"{name}.json", run.launcher_requests / f"{name}.done"
    if not done.exists():
        try:
            os.kill(int(runtime["launcher_pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            print(f"the launcher of {args.job!r} is not running", file=sys.stderr)  # noqa: T201
            return 2
        if not req.exists():
            write_json_atomic(
                req,
                {
                    "action": args.action,
                    "role": args.role,
                    "rank": args.rank,
                    "node": args.node,
                    "away_from": args.away_from,
                    "key": args.idempotency_key,
                    "extra": extra,
                    "ts": time.time(),
                },
            )
        deadline = time.monotonic() + args.wait
        while not done.exists():
            if time.monotonic() > deadline:
                print(f"the launcher did not answer within {args.wait:g}s", file=sys.stderr)  # noqa: T201
                return 3
            time.sleep(0.05)
    answer = read_json(done) or {}
    print(json.dumps(answer, sort_keys=True))  # noqa: T201
    return 0 if answer.get("ok") else 1


def _write_hook(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m workload.launch write-hook")
    p.add_argument("path")
    p.add_argument("--run-root", required=True)
    args = p.parse_args(argv)
    path = Path(args.path)
    root = str(Path(args.run_root).resolve())
    path.write_text(
        "#!/bin/sh\n# RLGuard launcher hook for the reference job (written by workload.launch)\n"
        f'exec {shlex.quote(sys.executable)} -m workload.launch hook --run-root {shlex.quote(root)} "$@"\n',
        encoding="utf-8",
    )
    path.chmod(0o755)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "hook":
        return _hook(argv[1:])
    if argv and argv[0] == "write-hook":
        return _write_hook(argv[1:])
    return _supervise(argv)


if __name__ == "__main__":
    sys.exit(main())
