"""``rlguard launch``: put any training command under RLGuard on this node.

::

    rlguard launch --job J --role R [--rank K | --nproc N] --run-dir D [--integration none|trl]
        [--standby] [--preload MOD,...] [--max-restarts N] [--backoff S] [--backoff-max S]
        [--backend local] [--timeout S] [--py-spy PATH] [--exit-causes FILE]
        [--first-step-budget S] -- CMD ARGS...

runs ``CMD ARGS`` once per rank (without ``--rank`` or ``--nproc``: one process, rank ``$RANK``
or 0) under :class:`recovery.supervision.Supervisor`, with the environment of
:mod:`integrations`. A process's exit, with the cause its log's tail matches in the exit-cause
catalogue (``--exit-causes``), is written into its heartbeat at once; the launcher hook's
restarts use the integration's resume arguments, and its ``capture_stacks`` uses py-spy
(``--py-spy``). A first step may take ``--first-step-budget`` seconds before RLGuard judges it
hung. ``python -m integrations.launch hook ...`` is the launcher hook and ``... write-hook PATH
--run-root ROOT`` writes one for ``RLGUARD_RECOVERY_LAUNCHER``. Bad arguments end in one line
on stderr and exit code 2, before anything is started.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from integrations import ENV_JOB, ENV_ROLE, ENV_RUN_DIR, Integration, IntegrationError
from integrations import load_integration as _load_integration
from integrations.snapshot_owner import start_for_launch
from recovery.supervision import hook
from recovery.supervision.backends import Backend, BackendError, known_backends, load_backend
from recovery.supervision.events import EVENTS_FILE, append_event
from recovery.supervision.exit_causes import Catalogue, CatalogueError, load_catalogue
from recovery.supervision.requests import JOB_DIR_PATTERN
from recovery.supervision.restarts import RestartBudget, RestartBudgetError
from recovery.supervision.stacks import find_py_spy
from recovery.supervision.standby import Order, OrderError, StandbyPool, python_target
from recovery.supervision.supervisor import Child, Supervisor

PROG = "rlguard launch"
MAX_NPROC = 256


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, no usage block: the message names the bad value.
        sys.stderr.write(f"{PROG}: error: {message}\n")
        raise SystemExit(2)


def _parser() -> _Parser:
    p = _Parser(prog=PROG, description="Run a training command under RLGuard on this node.")
    p.add_argument("--job", help="job name (default: the run directory's name)")
    p.add_argument("--role", required=True, help="the processes' role, e.g. trainer")
    ranks = p.add_mutually_exclusive_group()
    ranks.add_argument("--rank", help="wrap one process of this rank (default: $RANK or 0)")
    ranks.add_argument("--nproc", help="start this many processes, ranks 0..N-1")
    p.add_argument("--run-dir", required=True, help="the job's run directory (heartbeats, logs)")
    p.add_argument("--integration", default="none", help="framework integration: none, trl")
    p.add_argument("--standby", action="store_true", help="keep a warm standby per role")
    p.add_argument("--preload", help="modules a standby imports ahead (default: the integration's)")
    p.add_argument("--max-restarts", default="10", help="restart budget of this launch")
    p.add_argument(
        "--backoff",
        default="1",
        help="seconds before restarting a process that "
        "died quickly, doubled per quick failure in a row",
    )
    p.add_argument("--backoff-max", default="30", help="longest backoff, seconds")
    p.add_argument("--backend", default="local", help=f"one of {', '.join(known_backends())}")
    p.add_argument("--timeout", default=None, help="give up after this many seconds")
    p.add_argument(
        "--py-spy",
        help="py-spy executable for a hung process's stacks (default: the one installed with "
        "RLGuard, else on PATH); needs ptrace rights (CAP_SYS_PTRACE, see docs/deploy.md)",
    )
    p.add_argument(
        "--exit-causes",
        help="exit-cause catalogue (YAML; default: the one shipped with RLGuard) that a failed "
        "process's last output lines are matched against",
    )
    p.add_argument(
        "--first-step-budget",
        help="seconds a process's first step (after a start or a restart) may take before "
        "RLGuard judges it hung (default: the policy's first_step_budget_seconds)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


@dataclass(frozen=True)
class LaunchPlan:
    """Everything ``rlguard launch`` checked, ready to run."""

    job: str
    role: str
    ranks: list[int]
    world_size: int
    run_dir: Path
    command: list[str]
    integration: Integration
    backend: Backend
    budget: RestartBudget
    standby_preload: list[str] | None  # None: no standby
    timeout: float | None
    py_spy: str | None = None  # None: not installed, no stacks (the incident says so)
    exit_causes: Catalogue | None = None
    first_step_budget: float | None = None


def _number(p: _Parser, flag: str, text: str, *, integer: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        p.error(f"{flag} must be {kind}, got {text!r}")
    if value < 0 or value != value:
        p.error(f"{flag} must be >= 0, got {text!r}")
    return value


def _ranks(p: _Parser, rank: str | None, nproc: str | None) -> tuple[list[int], int]:
    if nproc is not None:
        n = int(_number(p, "--nproc", nproc, integer=True))
        if not 1 <= n <= MAX_NPROC:
            p.error(f"--nproc must be between 1 and {MAX_NPROC}, got {nproc!r}")
        return list(range(n)), n
    text = rank if rank is not None else os.environ.get("RANK", "0")
    flag = "--rank" if rank is not None else "$RANK"
    if not text.isdigit():
        p.error(f"{flag} must be a non-negative integer, got {text!r}")
    world = os.environ.get("WORLD_SIZE", "1")
    return [int(text)], int(world) if world.isdigit() and int(world) > int(text) else int(text) + 1


def _check_run_dir(p: _Parser, path: Path) -> None:
    """Create ``path`` if needed and prove it writable (heartbeats and logs go there)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".rlguard-probe-"):
            pass
    except OSError as exc:
        p.error(f"--run-dir {str(path)!r} is not a writable directory ({exc.strerror or exc})")


def plan(argv: list[str]) -> LaunchPlan:
    """Check ``argv``; exits 2 with one line naming the bad value (nothing started)."""
    p = _parser()
    args = p.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        p.error("no command to run: put it after --, e.g. rlguard launch ... -- python train.py")
    if shutil.which(command[0]) is None:
        p.error(f"command {command[0]!r} not found")
    if not hook.ROLE_PATTERN.fullmatch(args.role):
        p.error(f"--role {args.role!r} must be 1-64 of letters, digits, '_' and '.' (no '-')")
    ranks, world = _ranks(p, args.rank, args.nproc)
    run_dir = Path(args.run_dir).resolve()
    job = args.job if args.job is not None else run_dir.name
    if not JOB_DIR_PATTERN.fullmatch(job):
        p.error(f"--job {job!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    try:
        budget = RestartBudget(
            max_restarts=int(_number(p, "--max-restarts", args.max_restarts, integer=True)),
            backoff=_number(p, "--backoff", args.backoff),
            backoff_max=_number(p, "--backoff-max", args.backoff_max),
        )
    except RestartBudgetError as exc:
        p.error(str(exc))
    timeout = None if args.timeout is None else _number(p, "--timeout", args.timeout)
    first_step_budget = None
    if args.first_step_budget is not None:
        first_step_budget = _number(p, "--first-step-budget", args.first_step_budget)
        if not 0 < first_step_budget < float("inf"):
            p.error(
                f"--first-step-budget must be a positive number of seconds, "
                f"got {args.first_step_budget!r}"
            )
    try:
        backend = load_backend(args.backend)
        backend.check()
    except BackendError as exc:
        p.error(f"--backend: {exc}")
    try:
        integration = _load_integration(args.integration)
        integration.check_environment()
    except IntegrationError as exc:
        p.error(f"--integration {args.integration}: {exc}")
    preload = None
    if args.standby:
        try:
            python_target(command)
        except OrderError as exc:
            p.error(f"--standby: {exc}")
        default = list(getattr(integration, "preload_modules", ()))
        preload = default if args.preload is None else [m for m in args.preload.split(",") if m]
    elif args.preload is not None:
        p.error("--preload is for --standby")
    py_spy: str | None = args.py_spy
    if py_spy is None:
        py_spy = find_py_spy()
    elif not (os.path.isfile(py_spy) and os.access(py_spy, os.X_OK)):
        p.error(f"--py-spy {py_spy!r} is not an executable file")
    try:
        catalogue = load_catalogue(Path(args.exit_causes) if args.exit_causes else None)
    except CatalogueError as exc:
        p.error(f"--exit-causes: {exc}")
    _check_run_dir(p, run_dir)  # last: the only check that may create something
    return LaunchPlan(
        job,
        args.role,
        ranks,
        world,
        run_dir,
        command,
        integration,
        backend,
        budget,
        preload,
        timeout,
        py_spy,
        catalogue,
        first_step_budget,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_supervisor(launch: LaunchPlan, extra_env: Mapping[str, str] | None = None) -> Supervisor:
    """The supervisor that runs ``launch`` (not started yet); ``extra_env`` goes to every
    process (the memory-snapshot segment, :mod:`integrations.snapshot_owner`)."""
    base = dict(os.environ)
    base.update(extra_env or {})
    base.setdefault("PYTHONUNBUFFERED", "1")  # the child's log is read while it runs
    base.update({ENV_JOB: launch.job, ENV_ROLE: launch.role, ENV_RUN_DIR: str(launch.run_dir)})
    base["WORLD_SIZE"] = str(launch.world_size)
    # A world of one process gets one too, as under torchrun: a framework that sees RANK /
    # LOCAL_RANK (accelerate, hence the Hugging Face Trainer) sets up torch.distributed and
    # needs a rendezvous address. One rank of a larger world keeps what its starter gave it.
    if len(launch.ranks) > 1 or (launch.world_size == 1 and "MASTER_ADDR" not in base):
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))

    def env(child: Child) -> Mapping[str, str]:
        given = base.get("LOCAL_RANK", "")
        local = int(given) if len(launch.ranks) == 1 and given.isdigit() else child.rank
        return {**base, "RANK": str(child.rank), "LOCAL_RANK": str(local)}

    def command(child: Child) -> list[str]:
        if child.starts == 0:
            return list(launch.command)
        return launch.integration.resume_argv(list(launch.command))

    standby = None
    if launch.standby_preload is not None:
        preload = ",".join(launch.standby_preload)
        events = str(launch.run_dir / EVENTS_FILE)
        standby = StandbyPool(
            lambda role: [
                sys.executable,
                "-m",
                "recovery.supervision.standby_process",
                "--role",
                role,
                "--preload",
                preload,
                "--warmup",
                ",".join(getattr(launch.integration, "standby_warmup", ())),
                "--events",
                events,
            ],
            log_dir=launch.run_dir / "logs",
            env=base,
            on_event=lambda kind, **fields: append_event(Path(events), kind, **fields),
        )
    cwd = Path.cwd()
    sup = Supervisor(
        launch.run_dir,
        launch.job,
        [Child(launch.role, r) for r in launch.ranks],
        command=command,
        env=env,
        backend=launch.backend,
        budget=launch.budget,
        standby=standby,
        order=lambda child, argv, child_env, log: Order(
            argv, str(log), dict(child_env), str(cwd)
        ).to_line(),
        cwd=cwd,
        timeout=launch.timeout,
        py_spy=launch.py_spy,
        exit_causes=launch.exit_causes,
        first_step_budget=launch.first_step_budget,
    )
    return sup


def launch(argv: list[str]) -> int:
    """Run ``rlguard launch ARGV``; the exit code (0: every process finished cleanly)."""
    checked = plan(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s rlguard-launch %(levelname)s: %(message)s"
    )
    if checked.py_spy is None:
        logging.getLogger("rlguard.launch").warning(
            "py-spy not found: a hung process's stacks will not be captured (pip install py-spy)"
        )
    # The launcher owns the trainers' memory snapshots: it outlives every one of them.
    owner = start_for_launch(
        checked.integration, checked.job, checked.run_dir, checked.ranks, checked.world_size
    )
    sup = build_supervisor(checked, owner.env() if owner is not None else None)

    def on_signal(signum: int, _frame: object) -> None:
        sup.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        sup.start()
        return sup.loop()
    finally:
        sup.close()
        if owner is not None:
            owner.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "hook":
        return hook.main(
            argv[1:],
            prog=f"{PROG} hook",
            default_run_root=os.environ.get("RLGUARD_RECOVERY_RUN_ROOT"),
        )
    if argv and argv[0] == "write-hook":
        p = _Parser(prog=f"{PROG} write-hook")
        p.add_argument("path")
        p.add_argument("--run-root", required=True)
        args = p.parse_args(argv[1:])
        hook.write_hook(Path(args.path), module="integrations.launch", run_root=Path(args.run_root))
        return 0
    return launch(argv)


if __name__ == "__main__":
    sys.exit(main())
