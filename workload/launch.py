"""Launch and supervise the reference GRPO job, and serve as RLGuard's launcher hook.

Run the job::

    python -m workload.launch --run-dir DIR --steps N [--rollouts 2] [--on-failure wait]
                              [--backend local|slurm] [--resume auto|disable]

A run directory that holds a run of the job is resumed from its newest checkpoint and WAL
(``--resume auto``, the default); ``--resume disable`` starts from step 0 and refuses it.
The launcher hook (``RLGUARD_RECOVERY_LAUNCHER``) is :mod:`recovery.supervision.hook`, the same
for every job on the node: it leaves a request in ``<run_root>/<job>/recovery/launcher/`` for
the running supervisor and waits; a key already answered is answered again without acting::

    python -m workload.launch hook restart_role --job J --role rollout --rank 1 --idempotency-key K
    python -m workload.launch write-hook PATH --run-root ROOT   # an executable wrapper for it
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any

from recovery.supervision import hook
from recovery.supervision.backends import BackendError, load_backend
from recovery.supervision.requests import JOB_DIR_PATTERN as _JOB
from workload.job import ROLLOUT_ENGINES, JobConfig, JobConfigError, RunDir, read_json
from workload.task import TaskSpec

# verl's trainer.resume_mode values that mean something for the reference job (a run directory
# is the job's one checkpoint location, so verl's third, resume_path, has no counterpart).
RESUME_MODES = ("auto", "disable")


def _supervise_parser() -> argparse.ArgumentParser:
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
    p.add_argument(
        "--backend",
        default="local",
        help="how processes are started and the job is restarted: local (default) or slurm "
        "(inside a Slurm batch job: restart_job requeues it; drain_node drains the node)",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run the trainer and rollout workers as Ray actors (workload.ray_mode; rlguard[ray])",
    )
    p.add_argument("--ray-address", help="with --ray: a running Ray cluster (default: start one)")
    p.add_argument(
        "--ray-restart-by",
        choices=("ray", "rlguard", "none"),
        default=None,
        help="with --ray: who restarts a dead actor: Ray (max_restarts=-1, the default), "
        "RLGuard's restart_role through the job's restarter actor (max_restarts=0), or none: "
        "the job fails when one dies, as verl's does (to be resubmitted; max_restarts=0)",
    )
    _add_engine_options(p)
    p.add_argument(
        "--resume",
        choices=RESUME_MODES,
        default="auto",
        help="as verl's trainer.resume_mode: auto (the default) resumes a run directory that "
        "holds a run of the job from its newest checkpoint and WAL; disable starts from step 0 "
        "and refuses a run directory that holds a run (what a resubmission replaces with "
        "--resume=auto: the reference preset's resume argument, workload.ray_mode.rlguard_preset)",
    )
    return p


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    """Who generates the rollouts, and the options of the vLLM engines."""
    p.add_argument(
        "--rollout-engine",
        choices=ROLLOUT_ENGINES,
        default="torch",
        help="who generates the rollouts: the job's own torch sampler (default) or vLLM engines "
        "(one OpenAI server per rollout rank, refit through RLGuard's weight transfer: "
        "workload/engines/; rlguard[vllm])",
    )
    p.add_argument(
        "--model",
        help="with --rollout-engine vllm: the Hugging Face model directory the engines serve and "
        "the trainer trains (default: a tiny model built into RUN_DIR/model)",
    )
    p.add_argument(
        "--transport",
        choices=("tcp", "shm"),
        default=None,
        help="how new weights travel from the trainer to the rollouts (recovery.transfer; "
        "default: shm with --rollout-engine vllm, whose engines run on the trainer's host, "
        "unless --ray-address names a cluster; else tcp)",
    )
    p.add_argument(
        "--wait-engines",
        action="store_true",
        help="with --rollout-engine vllm: the first step waits until every engine serves",
    )
    p.add_argument(
        "--engine-probation",
        metavar="SECONDS|off",
        help="with --rollout-engine vllm: an engine quarantined for a transient reason (a failed "
        "request or refit, its processes alive) is probed after this many seconds with /health "
        "and a one-token completion, then refit and re-admitted if it answers (default 30; off: "
        "it stays out until RLGuard's restart_role replaces it)",
    )
    p.add_argument(
        "--engine-request-timeout",
        type=float,
        metavar="SECONDS",
        help="with --rollout-engine vllm: a rollout request not finished in this many seconds "
        "failed; its engine is quarantined and the request retried on another (default 120)",
    )


def _checked_config(
    p: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[JobConfig, Path, bool]:
    """The job's configuration, run directory and standby switch from the parsed options;
    a bad combination exits through ``p.error``."""
    if args.standby and args.on_failure != "wait":
        p.error(
            "--standby is for --on-failure wait (the whole-job restart starts every process cold)"
        )
    if args.ray and (args.on_failure != "wait" or args.standby):
        p.error("--ray restarts through Ray: not with --on-failure restart-job or --standby")
    if args.ray_address is not None and not args.ray:
        p.error("--ray-address: only with --ray")
    if args.ray_restart_by is not None and not args.ray:
        p.error("--ray-restart-by: only with --ray")
    if args.ray and args.backend != "local":
        p.error("--backend: --ray starts and restarts its processes through Ray")
    if args.model is not None and args.rollout_engine != "vllm":
        p.error("--model: only with --rollout-engine vllm")
    standby = args.on_failure == "wait" if args.standby is None else args.standby
    run_dir = Path(args.run_dir).resolve()
    if args.resume == "disable" and RunDir(run_dir).config.exists():
        # Starting over on top of a run's WAL, batches and checkpoints would mix the two runs.
        p.error(
            f"--resume disable: {run_dir} already holds a run of the job (its job.json): "
            f"resume it with --resume auto, or give a new --run-dir"
        )
    job = args.job or run_dir.name
    if not _JOB.fullmatch(job):
        p.error(f"--job {job!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    if args.group_size < 2:
        p.error(
            f"--group-size must be >= 2 (advantages are relative to the group), got {args.group_size}"
        )
    if args.prompts_per_worker < 1:
        p.error(f"--prompts-per-worker must be >= 1, got {args.prompts_per_worker}")
    engines = {**_engine_probation(p, args), **_engine_request_timeout(p, args)}
    try:
        config = JobConfig(
            job=job,
            steps=args.steps,
            rollouts=args.rollouts,
            seed=args.seed,
            decode_ms_per_token=args.decode_ms,
            task=TaskSpec(group_size=args.group_size, prompts_per_worker=args.prompts_per_worker),
            rollout_engine=args.rollout_engine,
            model_dir=_model_dir(p, args, run_dir),
            transport=args.transport or _default_transport(args),
            wait_all_engines=args.wait_engines,
            **engines,
        )
    except JobConfigError as exc:
        p.error(str(exc))
    return config, run_dir, standby


def _engine_probation(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--engine-probation`` as JobConfig's ``engine_probation_s`` (nothing: its default)."""
    raw = args.engine_probation
    if raw is None:
        return {}
    if args.rollout_engine != "vllm":
        p.error("--engine-probation: only with --rollout-engine vllm")
    if raw == "off":
        return {"engine_probation_s": None}
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        p.error(f"--engine-probation must be seconds >= 0 or 'off', got {raw!r}")
    return {"engine_probation_s": seconds}


def _engine_request_timeout(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """``--engine-request-timeout`` as JobConfig's ``engine_request_timeout_s``."""
    timeout = args.engine_request_timeout
    if timeout is None:
        return {}
    if args.rollout_engine != "vllm":
        p.error("--engine-request-timeout: only with --rollout-engine vllm")
    if not (math.isfinite(timeout) and timeout > 0):
        p.error(f"--engine-request-timeout must be seconds > 0, got {timeout!r}")
    return {"engine_request_timeout_s": timeout}


def _default_transport(args: argparse.Namespace) -> str:
    # Shared memory reaches only the engines on the trainer's host: those of the local
    # supervisor and of a Ray this launcher starts; a cluster's actors may run anywhere.
    if args.rollout_engine == "vllm" and args.ray_address is None:
        return "shm"
    return "tcp"


def _model_dir(p: argparse.ArgumentParser, args: argparse.Namespace, run_dir: Path) -> str | None:
    """The model the engines serve: ``--model``, else a tiny one built into the run directory
    (``integrations.vllm.tiny_model``; an existing one is reused, so a resumed run keeps it)."""
    if args.rollout_engine != "vllm":
        return None
    if args.model is not None:
        model = Path(args.model).resolve()
        if not (model / "config.json").is_file():
            p.error(
                f"--model {args.model!r} is not a Hugging Face model directory (no config.json)"
            )
        return str(model)
    from integrations.vllm.tiny_model import save_tiny_model

    return str(save_tiny_model(run_dir / "model"))


def _supervise(argv: list[str]) -> int:
    p = _supervise_parser()
    args = p.parse_args(argv)
    config, run_dir, standby = _checked_config(p, args)
    logging.basicConfig(
        level=os.environ.get("RLGUARD_WORKLOAD_LOG", "WARNING"),
        format="%(asctime)s launch %(levelname)s %(name)s: %(message)s",
    )
    if args.ray:
        from workload.ray_mode import run_on_ray

        code = run_on_ray(
            RunDir(run_dir),
            config,
            address=args.ray_address,
            timeout=args.timeout,
            restart_by=args.ray_restart_by or "ray",
        )
        return _finished(run_dir, code)
    try:
        backend = load_backend(args.backend)
        backend.check()
    except BackendError as exc:
        p.error(f"--backend: {exc}")
    # Imported here: the hook and write-hook commands below must not pay for torch (the
    # recovery worker starts the hook for every action, on the recovery path).
    from workload.job_supervisor import Supervisor

    sup = Supervisor(
        RunDir(run_dir),
        config,
        on_failure=args.on_failure,
        hang_timeout=args.hang_timeout,
        timeout=args.timeout,
        standby=standby,
        backend=backend,
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
    return _finished(run_dir, code)


def _finished(run_dir: Path, code: int) -> int:
    if code == 0:
        final = read_json(RunDir(run_dir).final) or {}
        print(json.dumps({"done": True, **final}))  # noqa: T201 - CLI output
    return code


def _hook(argv: list[str]) -> int:
    # The one launcher hook (recovery.supervision.hook): it serves this job and rlguard launch.
    return hook.main(
        argv,
        prog="python -m workload.launch hook",
        default_run_root=os.environ.get("RLGUARD_RECOVERY_RUN_ROOT"),
    )


def _write_hook(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m workload.launch write-hook")
    p.add_argument("path")
    p.add_argument("--run-root", required=True)
    args = p.parse_args(argv)
    hook.write_hook(Path(args.path), module="workload.launch", run_root=Path(args.run_root))
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
