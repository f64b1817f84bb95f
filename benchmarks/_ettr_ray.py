"""``benchmarks/ettr.py --ray``: ETTR of the reference job in Ray mode, healed by RLGuard through
Ray against the same faults handled by resubmitting the whole job through the Jobs API.

One local Ray (CPU only, small, started here with its dashboard: the state and Jobs APIs) and the
real server (embedded Celery worker whose launcher hook is the Ray hook) run throughout. The same
job (``python -m workload.launch --ray --rollouts 1``, its actors created with
``max_restarts=0``, as verl creates its workers) runs three ways:

1. **clean**: no fault (``--ray-restart-by rlguard``, nothing to restart);
2. **rlguard**: ``kill -9`` of the rollout actor's worker process mid-batch every
   ``--fault-every`` steps; the real agent (``--ray``, ``--verl-log`` from the controller's
   verl-format step log) reports the actor DEAD with Ray's cause -> heartbeat_lost ->
   restart_role -> the Ray hook asks the job's restarter actor to create it again -> the role
   resumes from the WAL (``--ray-restart-by rlguard``);
3. **whole-job**: the same kills; the job fails as soon as one actor dies, as verl's does
   (``--ray-restart-by none``), and is resubmitted through the Jobs API by a watcher that polls
   its status every second, as a retry wrapper around ``ray job submit`` would; the new driver
   resumes from the newest checkpoint and the WAL of the same run directory.

Only rollout workers are killed (the trainer's death under RLGuard ends in the same restarter;
its multi-kill handling is not measured here). Wall time = launcher start -> its exit (the last
submission's end for whole-job); ETTR = clean wall / this wall. Printed: both ETTRs, their ratio,
the same from each run's own event log (wall less each kill's loss: last step before it -> first
step after it, less a clean step; blind to the machine's load changing between the runs), kills,
kill -> incident / restart_role requested / done for RLGuard, and whether the final parameters
equal the clean run's. ``--keep`` keeps the work directory and ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli.demo import NODE, DemoStack  # noqa: E402
from integrations.ray.hook import write_hook  # noqa: E402
from recovery.report import heartbeat_path  # noqa: E402
from workload.job import RunDir, read_events, read_json  # noqa: E402
from workload.ray_mode import rlguard_preset  # noqa: E402


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Faults(threading.Thread):
    """kill -9 of rollout 0's worker process shortly into its batch of each fault step."""

    def __init__(self, run: RunDir, steps: list[int], delay: float) -> None:
        super().__init__(daemon=True)
        self.rundir, self.steps, self.delay = run, steps, delay
        self.kills: list[tuple[int, float]] = []  # (step, wall clock of the kill)
        self.stop = threading.Event()

    def run(self) -> None:  # type: ignore[override]
        for step in self.steps:
            while not self.stop.is_set():
                started = [
                    e
                    for e in read_events(self.rundir)
                    if e["kind"] == "batch_start" and e["step"] == step and e["rank"] == 0
                ]
                if started:
                    break
                time.sleep(0.05)
            if self.stop.wait(self.delay):
                return
            beat = read_json(heartbeat_path(self.rundir.root, "rollout", 0)) or {}
            try:
                os.kill(int(beat["pid"]), signal.SIGKILL)
            except (KeyError, ProcessLookupError):
                continue
            self.kills.append((step, time.time()))


def _launch_argv(
    run_dir: Path, steps: int, decode_ms: float, restart_by: str, address: str
) -> list[str]:
    return [
        sys.executable, "-m", "workload.launch", "--run-dir", str(run_dir), "--steps", str(steps),
        "--rollouts", "1", "--decode-ms", str(decode_ms), "--ray", "--ray-address", address,
        "--ray-restart-by", restart_by,
    ]  # fmt: skip


def _run_launcher(argv: list[str], log: Path, env: dict[str, str], timeout: float) -> float:
    started = time.monotonic()
    with open(log, "ab") as out:
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False).returncode  # fmt: skip
    if code != 0:
        raise RuntimeError(f"{argv[4]} exited {code}; see {log}")
    return time.monotonic() - started


def _whole_job(
    dashboard: str, argv: list[str], env: dict[str, str], timeout: float
) -> tuple[float, int]:
    """Submit through the Jobs API; resubmit on FAILED. (wall seconds, submissions)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    entrypoint = " ".join(argv)
    runtime_env = {"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}}
    started, submissions = time.monotonic(), 0
    while time.monotonic() - started < timeout:
        sid = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        submissions += 1
        while True:
            status = str(client.get_job_status(sid).value)
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                break
            time.sleep(1.0)  # the watcher's poll
        if status == "SUCCEEDED":
            return time.monotonic() - started, submissions
        if submissions > 50:
            raise RuntimeError(
                f"the job failed {submissions} times: {client.get_job_logs(sid)[-2000:]}"
            )
    raise RuntimeError(f"the whole-job way did not finish within {timeout:g} s")


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _reactions(
    stack: DemoStack, job: str, kills: list[tuple[int, float]]
) -> dict[str, list[float]]:
    """Per kill, seconds to the incident (a kill while the previous one's incident is still
    open is an update of it: no new incident) and to RLGuard's restart_role (requested, and
    done: the restarter created the actor)."""
    incidents = [i for i in stack.incidents() if i["job"] == job and i["kind"] == "heartbeat_lost"]
    opened = sorted(_ts(i["opened_at"]) for i in incidents)
    actions = [a for i in incidents for a in stack.incident(i["id"])["actions"]
               if a["action"] == "restart_role" and a["status"] == "succeeded"]  # fmt: skip
    out: dict[str, list[float]] = {"incident": [], "restart_requested": [], "restart_done": []}
    for n, (_step, t) in enumerate(kills):
        end = kills[n + 1][1] if n + 1 < len(kills) else float("inf")
        for name, times in (("incident", opened),
                            ("restart_requested", [_ts(a["created_at"]) for a in actions]),
                            ("restart_done", [_ts(a["finished_at"]) for a in actions])):  # fmt: skip
            after = sorted(x - t for x in times if t - 0.5 <= x < end)
            if after:
                out[name].append(after[0])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="benchmarks/ettr.py --ray", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fault-every", type=int, default=10)
    p.add_argument("--decode-ms", type=float, default=15.0)
    p.add_argument("--delay", type=float, default=0.3, help="kill this long into the batch")
    p.add_argument("--timeout", type=float, default=1200.0, help="per way")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error(f"--steps {args.steps} is too short (at least 4)")
    if not 2 <= args.fault_every < args.steps:
        p.error(
            f"--fault-every {args.fault_every} must be in 2..steps-1 (a fault in step 0-1 is "
            f"a heavy first-step anomaly)"
        )
    import ray

    fault_steps = list(range(args.fault_every, args.steps, args.fault_every))
    workdir = Path(tempfile.mkdtemp(prefix="rlguard-ettr-ray-"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    port = _free_port()
    ctx = ray.init(num_cpus=2, include_dashboard=True, dashboard_host="127.0.0.1",
                   dashboard_port=port, object_store_memory=80 * 1024 * 1024, logging_level="ERROR",
                   log_to_driver=False, _temp_dir=tempfile.mkdtemp(prefix="rlgray-", dir="/tmp"))  # fmt: skip
    gcs, dashboard = ctx.address_info["gcs_address"], f"http://127.0.0.1:{port}"
    # After ray.init: it sets what its clients need (the cluster's auth token) in os.environ.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}

    def allow_every_kill(policy: dict[str, Any]) -> None:
        # The same rollout rank is killed every ~30 s here; the shipped restart budget (3 per
        # rank in 30 min) would rightly hand the 4th kill to an approver, and this benchmark
        # measures the automatic path: one restart per kill is allowed.
        policy["guardrails"]["budgets"]["restart_role"]["per_rank"] = len(fault_steps) + 1

    stack = DemoStack(workdir / "stack", _free_port(), job="idle", schedule=None,
                      policy_edit=allow_every_kill)  # fmt: skip
    walls: dict[str, float] = {}
    info: dict[str, Any] = {}
    try:
        stack.start_server()
        preset = workdir / "preset.json"
        preset.write_text(json.dumps(rlguard_preset("rlguard")))
        write_hook(stack.workdir / "launcher-hook", [
            "--dashboard", dashboard, "--ray-address", gcs, "--preset", str(preset),
            "--ray-job", "rlguard", "--state-dir", str(workdir / "ray-hook"),
        ])  # fmt: skip
        print(f"Ray and the server up; {args.steps} steps, rollout-0 killed at steps {fault_steps}; "
              f"restart budget raised to {len(fault_steps) + 1} per rank (shipped: 3 in 30 min)",
              flush=True)  # fmt: skip
        runs = {name: RunDir(stack.run_root / name) for name in ("clean", "rlguard", "wholejob")}

        walls["clean"] = _run_launcher(
            _launch_argv(runs["clean"].root, args.steps, args.decode_ms, "rlguard", gcs),
            workdir / "clean.log",
            env,
            args.timeout,
        )
        print(f"clean: {walls['clean']:.1f} s", flush=True)

        verl_log = workdir / "verl.jsonl"
        stack._spawn("agent", [
            sys.executable, "-m", "agents", "--server", stack.url,
            "--token-file", str(stack.workdir / "node.token"), "--node", NODE,
            "--run-dir", str(stack.run_dir), "--interval", "0.5", "--simulate-gpus", "2",
            "--spool-dir", str(stack.workdir / "spool"), "--log-level", "WARNING",
            "--ray", dashboard, "--ray-preset", str(preset), "--ray-job", "rlguard",
            "--verl-log", str(verl_log),
        ])  # fmt: skip
        faults = Faults(runs["rlguard"], fault_steps, args.delay)
        faults.start()
        try:
            walls["rlguard"] = _run_launcher(
                _launch_argv(runs["rlguard"].root, args.steps, args.decode_ms, "rlguard", gcs),
                workdir / "rlguard.log",
                {**env, "VERL_FILE_LOGGER_PATH": str(verl_log)},
                args.timeout,
            )
        finally:
            faults.stop.set()
        info["rlguard"] = {
            "kills": faults.kills,
            "react": _reactions(stack, "rlguard", faults.kills),
        }
        stack.stop_one("agent")
        print(f"rlguard: {walls['rlguard']:.1f} s, {len(faults.kills)} kills", flush=True)

        faults = Faults(runs["wholejob"], fault_steps, args.delay)
        faults.start()
        try:
            walls["whole-job"], submissions = _whole_job(
                dashboard,
                _launch_argv(runs["wholejob"].root, args.steps, args.decode_ms, "none", "auto"),
                env,
                args.timeout,
            )
        finally:
            faults.stop.set()
        info["whole-job"] = {"kills": faults.kills, "submissions": submissions}
        print(f"whole-job: {walls['whole-job']:.1f} s, {len(faults.kills)} kills, "
              f"{submissions} submissions", flush=True)  # fmt: skip
    finally:
        stack.stop()
        ray.shutdown()
    try:
        _report(walls, info, runs)
    finally:
        if args.keep:
            (workdir / "results.json").write_text(json.dumps({"walls": walls, "info": info}))
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _step_times(run: RunDir) -> list[float]:
    return sorted(e["ts"] for e in read_events(run) if e["kind"] == "step")


def own_ettr(
    run: RunDir, kills: list[tuple[int, float]], clean_step_s: float, wall: float
) -> float:
    """The same run measured from its own event log, blind to load changes between runs: its
    wall time less each kill's loss (last step before the kill -> first step after it, less
    one clean step), over its wall time."""
    steps = _step_times(run)
    lost = 0.0
    for _step, t in kills:
        before = [x for x in steps if x < t]
        after = [x for x in steps if x > t]
        if before and after:
            lost += max(0.0, after[0] - before[-1] - clean_step_s)
    return (wall - lost) / wall


def _report(walls: dict[str, float], info: dict[str, Any], runs: dict[str, RunDir]) -> None:
    clean_params = (read_json(runs["clean"].final) or {}).get("params_sha256")
    clean_steps = _step_times(runs["clean"])
    clean_step_s = statistics.median(
        b - a for a, b in zip(clean_steps, clean_steps[1:], strict=False)
    )
    print()
    print(f"{'way':<10} {'wall s':>8} {'ETTR':>6} {'kills':>6} {'params=clean':>13}")
    ettr = {}
    for name, run_name in (("clean", "clean"), ("rlguard", "rlguard"), ("whole-job", "wholejob")):
        ettr[name] = walls["clean"] / walls[name]
        same = (read_json(runs[run_name].final) or {}).get("params_sha256") == clean_params
        kills = len(info.get(name, {}).get("kills", []))
        print(f"{name:<10} {walls[name]:>8.1f} {ettr[name]:>6.3f} {kills:>6} {str(same):>13}")
    react = info["rlguard"]["react"]
    print()
    print(f"ETTR rlguard {ettr['rlguard']:.3f} (target >= 0.90: "
          f"{'met' if ettr['rlguard'] >= 0.90 else 'NOT met'}), whole-job resubmission "
          f"{ettr['whole-job']:.3f} ({info['whole-job']['submissions']} submissions), ratio "
          f"{ettr['rlguard'] / ettr['whole-job']:.2f}x")  # fmt: skip
    own = {name: own_ettr(runs[run_name], info[name]["kills"], clean_step_s, walls[name])
           for name, run_name in (("rlguard", "rlguard"), ("whole-job", "wholejob"))}  # fmt: skip
    print(f"from each run's own event log (clean median step {clean_step_s:.2f} s; blind to the "
          f"load changing between runs): rlguard {own['rlguard']:.3f}, whole-job "
          f"{own['whole-job']:.3f}, ratio {own['rlguard'] / own['whole-job']:.2f}x")  # fmt: skip
    for name, values in react.items():
        if values:
            print(f"kill -> {name} (rlguard): mean {statistics.mean(values):.2f} s, "
                  f"max {max(values):.2f} s, seen for {len(values)} of "
                  f"{len(info['rlguard']['kills'])} kills")  # fmt: skip
