"""ETTR of a real TRL GRPO job (examples/trl_grpo/train.py) under faults, three ways.

One invocation runs the example job of ``--steps`` steps (``--size full``: 1-3 s per step on two
CPU cores), every way under the same start-up costs:

1. **clean**: ``rlguard launch --integration trl`` with RLGuardCallback, no fault;
2. **rlguard**: the same, with a fault every ``--fault-every`` steps, alternately ``kill -9`` of
   the trainer and a SIGSTOP hang, recovered by RLGuard: launcher (EXITED) or silence / no step
   -> agent -> server -> policy engine (heartbeat_lost or train_hang, medium) -> Celery worker
   -> launcher hook -> restart with ``--resume_from_checkpoint <newest sealed checkpoint>``;
3. **shell-retry**: the same faults under common practice: a retry loop that restarts the script
   as soon as it exits, with ``--resume_from_checkpoint <highest checkpoint-N>``, and catches a
   hang only by a watchdog (no new step for 600 s, the collective timeout of verl and NCCL-style
   setups) scaled by the same factor as the job's step time.

The scale factor is this job's clean median step time over ``--real-step-seconds`` (30 s, a GRPO
step of a 7B model on one 8-GPU node); it scales the watchdog and the policy's time limits
(hang_min_seconds, heartbeat suspect/confirm, the incidents' quiet period; floored at what the
agent's 0.5 s sampling can tell apart), and is printed. In the RLGuard way a fault also waits
until the previous fault's incident has closed: the policy engine folds a new fault of the same
participant into an incident that is still open and plans nothing new for it (a gap this
benchmark found; training goes on meanwhile, so the wait costs no ETTR). ETTR = clean wall time / this way's wall time; the targets are
ETTR >= 0.85 with RLGuard and a callback overhead < 1 % of the step time. Printed too: each
fault's timeline (fault, exit or hang seen, incident opened, action started, restarted, first
step done) and the callback's overhead per step, measured two ways in one process: the time
spent inside the callback's hooks and its generate wrapper, and the step time with and without
the callback (the second is at the mercy of a busy machine's noise; the first is not).

    .venv/bin/python benchmarks/ettr_trl.py                        # 60 steps, a fault every 10
    .venv/bin/python benchmarks/ettr_trl.py --steps 12 --fault-every 4 --size tiny   # smoke
    .venv/bin/python benchmarks/ettr_trl.py --only-snapshot-cost   # snapshots vs TRL's save

Under ``rlguard launch`` the example takes a memory snapshot every step
(:mod:`integrations.trl.snapshots`), so the RLGuard way resumes from the newest snapshot, not
from ``checkpoint-N``. Printed last: a snapshot's blocking time per step against TRL's own save
at the same frequency (every step), and a restore from memory against TRL's
``resume_from_checkpoint`` from disk. Not done yet (issue 39): the per-fault-class split of the
seconds lost, ``torchrun --max-restarts``, ``ft_launcher`` and DLRover as further ways.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli.demo import DemoStack  # noqa: E402
from integrations.trl.checkpoints import checkpoint_dirs  # noqa: E402
from recovery.report import heartbeat_path, read_heartbeat  # noqa: E402

EXAMPLE = ROOT / "examples" / "trl_grpo" / "train.py"
WATCHDOG_S = 600.0
HANG_MIN_S = 120.0
SUSPECT_S, CONFIRM_S = 15.0, 60.0
QUIET_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_steps(out: Path) -> list[dict[str, Any]]:
    path = out / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@dataclass
class Fault:
    kind: str  # "kill" or "hang"
    at_step: int
    ts: float
    pid: int
    marks: dict[str, float] = field(default_factory=dict)
    redone: int | None = None  # steps trained again after the restart (first_step_after)


class ScaledStack(DemoStack):
    """The demo stack with the shipped policy's time limits scaled to this job, and a restart
    budget that lets every injected fault be healed automatically (the same trainer is restarted
    once per fault; the shipped 3 per rank in 30 min would hand the 4th to an approver)."""

    factor: float = 1.0
    restarts_per_rank: int = 3

    def _env(self) -> dict[str, str]:
        self.policy_edit = self._scale
        return super()._env()

    def _scale(self, data: dict[str, Any]) -> None:
        data["detection"]["trainer"]["hang_min_seconds"] = max(3.0, HANG_MIN_S * self.factor)
        data["detection"]["heartbeat"].update(
            suspect_seconds=max(2.0, SUSPECT_S * self.factor),
            confirm_seconds=max(3.0, CONFIRM_S * self.factor),
        )
        data["incidents"]["quiet_period_seconds"] = max(3.0, QUIET_S * self.factor)
        data["guardrails"]["budgets"]["restart_role"]["per_rank"] = self.restarts_per_rank


def train_argv(out: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--max_steps", str(args.steps),
            "--save_steps", str(args.save_steps), "--size", args.size]  # fmt: skip


class Injector(threading.Thread):
    """Watches the step log; at every ``every``-th new step, kills or stops the trainer."""

    def __init__(self, out: Path, every: int, steps: int, pid_of: Any, ready: Any = None) -> None:
        super().__init__(daemon=True)
        self.out, self.every, self.steps, self.pid_of = out, every, steps, pid_of
        self.ready = ready or (lambda: True)
        self.faults: list[Fault] = []
        self.stop = threading.Event()

    def run(self) -> None:
        targets = list(range(self.every, self.steps, self.every))
        while targets and not self.stop.wait(0.05):
            steps = read_steps(self.out)
            if not steps or max(s["step"] for s in steps) < targets[0]:
                continue
            pid = self.pid_of()
            if pid is None or steps[-1]["pid"] != pid or not self.ready():
                continue
            kind = "kill" if len(self.faults) % 2 == 0 else "hang"
            os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            self.faults.append(Fault(kind, targets.pop(0), time.time(), pid))


def first_step_after(out: Path, fault: Fault) -> float | None:
    """When the first step after ``fault`` finished (in another process); also records in
    ``fault.redone`` how many steps trained before the fault were trained again (the resumed
    checkpoint's age: a fault that lands before the save of step N goes back to N - save_steps)."""
    steps = read_steps(out)
    later = [s for s in steps if s["pid"] != fault.pid and s["t"] > fault.ts]
    if not later:
        return None
    first = min(later, key=lambda s: s["t"])
    before = [s["step"] for s in steps if s["pid"] == fault.pid and s["t"] <= fault.ts]
    fault.redone = max(0, max(before, default=0) - (first["step"] - 1))
    return float(first["t"])


def run_rlguard(
    stack: ScaledStack, name: str, args: argparse.Namespace, faults: bool
) -> dict[str, Any]:
    out = stack.workdir / f"{name}-out"
    run_dir = stack.run_root / name
    out.mkdir(parents=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    stack.job = name
    stack.stop_one("agent")
    stack.start_agent()
    argv = [sys.executable, "-m", "integrations.launch", "--job", name, "--role", "trainer",
            "--run-dir", str(run_dir), "--integration", "trl", "--max-restarts", "20",
            "--backoff", "0.2", *(["--standby"] if args.standby else []),
            "--", *train_argv(out, args)]  # fmt: skip

    def pid_of() -> int | None:
        beat = read_heartbeat(heartbeat_path(run_dir, "trainer", 0)) or {}
        return beat.get("pid") if beat.get("phase") in ("ROLLOUT", "TRAIN") else None

    def no_open_incident() -> bool:
        # The policy engine folds a new fault of a participant whose incident is still open
        # (within its quiet period) into that incident and plans nothing new: the next fault
        # waits for the previous incident to close (training goes on meanwhile).
        return not any(i["job"] == name and i["status"] == "open" for i in stack.incidents())

    injector = Injector(out, args.fault_every, args.steps, pid_of, no_open_incident)
    started = time.time()
    proc = stack._spawn(f"launch-{name}", argv)
    if faults:
        injector.start()
    code = proc.wait()
    wall = time.time() - started
    injector.stop.set()
    if code != 0:
        raise SystemExit(f"{name}: rlguard launch exited {code}; see {stack.workdir}/logs")
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    incidents = [i for i in stack.incidents() if i["job"] == name]
    for f in injector.faults:
        exits = [e["ts"] for e in events if e["kind"] == "child_exit" and e["ts"] >= f.ts - 0.5]
        spawns = [e["ts"] for e in events if e["kind"] == "spawn" and e["ts"] > f.ts]
        mine = [i for i in incidents if _ts(i["opened_at"]) >= f.ts - 1]
        if mine:
            inc = stack.incident(min(mine, key=lambda i: _ts(i["opened_at"]))["id"])
            f.marks["incident"] = _ts(inc["opened_at"])
            f.marks["kind"] = inc["kind"]
            acts = [a for a in inc["actions"] if a.get("started_at")]
            if acts:
                f.marks["action"] = min(_ts(a["started_at"]) for a in acts)
        if f.kind == "kill" and exits:
            f.marks["seen"] = min(exits)
        elif "incident" in f.marks:
            f.marks["seen"] = f.marks["incident"]
        if spawns:
            f.marks["restarted"] = min(spawns)
        first = first_step_after(out, f)
        if first is not None:
            f.marks["first_step"] = first
    return {"wall": wall, "faults": injector.faults, "out": out}


def run_shell_retry(workdir: Path, args: argparse.Namespace, watchdog: float) -> dict[str, Any]:
    """A retry loop as a shell script would do it (restart on exit, resume from the highest
    checkpoint-N), with a no-progress watchdog for hangs."""
    out = workdir / "shell-out"
    out.mkdir(parents=True)
    log = open(workdir / "logs" / "shell-retry.log", "ab")  # noqa: SIM115
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    env["PYTHONPATH"] = str(ROOT)
    current: dict[str, Any] = {}
    injector = Injector(out, args.fault_every, args.steps, lambda: current.get("pid"))
    started = time.time()
    injector.start()
    argv = train_argv(out, args)
    spawns: list[tuple[float, int]] = []
    watchdog_fired: list[float] = []
    exits: list[float] = []
    same_resume_failures = 0
    crash_loop = None
    while True:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        current["pid"] = proc.pid
        spawns.append((time.time(), proc.pid))
        last_progress, last_count = time.time(), len(read_steps(out))
        while proc.poll() is None:
            time.sleep(0.1)
            count = len(read_steps(out))
            if count != last_count:
                last_progress, last_count = time.time(), count
            elif time.time() - last_progress > watchdog:
                watchdog_fired.append(time.time())
                proc.kill()  # what a collective timeout does: the process aborts
                proc.wait()
        exits.append(time.time())
        if proc.returncode == 0:
            break
        ckpts = checkpoint_dirs(out)  # highest number first, as resume_from_checkpoint=True
        resume = ["--resume_from_checkpoint", str(ckpts[0][1])] if ckpts else []
        same_resume_failures = same_resume_failures + 1 if resume == argv[-2:] else 1
        if same_resume_failures > 3:
            # The highest checkpoint is torn and the loop resumes from it forever (the Trainer
            # refuses it, or worse resumes with a fresh optimizer): the job never finishes.
            crash_loop = resume[-1]
            break
        argv = train_argv(out, args) + resume
    wall = time.time() - started
    injector.stop.set()
    for f in injector.faults:
        seen = [t for t in (watchdog_fired if f.kind == "hang" else exits) if t >= f.ts]
        if seen:
            f.marks["seen"] = min(seen)
        restarts = [t for t, pid in spawns if t > f.ts]
        if restarts:
            f.marks["restarted"] = min(restarts)
        first = first_step_after(out, f)
        if first is not None:
            f.marks["first_step"] = first
    return {"wall": wall, "faults": injector.faults, "out": out, "crash_loop": crash_loop}


def median_step(out: Path) -> float:
    steps = read_steps(out)
    gaps = [b["t"] - a["t"] for a, b in zip(steps, steps[1:], strict=False) if a["pid"] == b["pid"]]
    return statistics.median(gaps) if gaps else float("nan")


def print_timeline(name: str, result: dict[str, Any]) -> None:
    print(f"  {name}: per fault, seconds after the fault")
    for f in result["faults"]:
        marks = " ".join(
            f"{k}={f.marks[k] - f.ts:6.1f}" for k in ("seen", "incident", "action", "restarted", "first_step")
            if isinstance(f.marks.get(k), float)
        )  # fmt: skip
        kind = f" ({f.marks['kind']})" if "kind" in f.marks else ""
        redone = f" redone={f.redone} steps" if f.redone is not None else ""
        print(f"    step {f.at_step:3d} {f.kind:4s}{kind:16s} {marks}{redone}")


def measure_overhead(workdir: Path, args: argparse.Namespace) -> None:
    """The callback's cost per step, in this process: its own time and an A/B of step times."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(EXAMPLE.parent))
    import train as example  # the example job itself

    from integrations.trl.callback import RLGuardCallback

    spent, depth, sealing = [0.0], [0], [0.0]

    class Timed(RLGuardCallback):
        pass

    for hook in (
        "on_step_begin",
        "on_step_end",
        "on_log",
        "on_save",
        "on_evaluate",
        "_count_tokens",
        "_set_phase",
    ):
        original = getattr(RLGuardCallback, hook)

        def timed(self: Any, *a: Any, _original: Any = original, **kw: Any) -> Any:
            depth[0] += 1  # a phase set inside a hook is the hook's time, counted once
            began = time.perf_counter()
            try:
                return _original(self, *a, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    took = time.perf_counter() - began
                    if _original.__name__ == "on_save":
                        sealing[0] += took
                    else:
                        spent[0] += took

        setattr(Timed, hook, timed)

    def one(with_callback: bool, tag: str) -> float:
        out = workdir / f"overhead-{tag}"
        parsed = example.parse_args(["--output_dir", str(out), "--max_steps", str(args.overhead_steps),
                                     "--save_steps", str(args.save_steps), "--size", args.size,
                                     "--rlguard", "off"])  # fmt: skip
        trainer = example.build_trainer(parsed)
        if with_callback:
            trainer.add_callback(Timed(workdir / f"overhead-run-{tag}"))
        trainer.train()
        return median_step(out)

    without = one(False, "a")
    spent[0] = sealing[0] = 0.0
    with_cb = one(True, "b")
    per_step = spent[0] / args.overhead_steps
    saves = max(1, args.overhead_steps // args.save_steps)
    seal = sealing[0] / saves
    print(f"callback overhead  in-callback {per_step * 1e3:.2f} ms/step = "
          f"{per_step / with_cb:.3%} of the {with_cb:.3f} s step (target < 1 %); sealing a "
          f"checkpoint (fsync + CRC-32 of every file, marker) {seal * 1e3:.0f} ms per save = "
          f"{seal / args.save_steps / with_cb:.3%} of step time at --save-steps "
          f"{args.save_steps}; A/B median step {without:.3f} s without, {with_cb:.3f} s with "
          f"({(with_cb - without) / without:+.1%}, noise on a busy machine)")  # fmt: skip


def measure_snapshot_cost(workdir: Path, args: argparse.Namespace) -> None:
    """Memory snapshots against TRL's own save at the same frequency (every step), in this
    process: what each blocks the step for, and what a restore costs from memory (the snapshot
    written in the Trainer's layout, then its resume) and from TRL's ``checkpoint-N`` on disk."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(EXAMPLE.parent))
    import train as example  # the example job itself
    from transformers import TrainerCallback

    from integrations.snapshot_owner import ENV_SNAPSHOT_SHM, rank_dir
    from integrations.trl.snapshots import enable_snapshots, materialize_resume, resume_dir
    from recovery.checkpoint.segment_owner import write_owner

    steps = args.overhead_steps

    class SaveTimer(TrainerCallback):  # the Trainer saves between on_log and on_save
        def __init__(self) -> None:
            self.began = 0.0
            self.saves: list[float] = []

        def on_log(self, *a: Any, **kw: Any) -> None:
            self.began = time.perf_counter()

        def on_save(self, *a: Any, **kw: Any) -> None:
            self.saves.append(time.perf_counter() - self.began)

    def trainer_for(tag: str, save_steps: int, max_steps: int = steps) -> Any:
        parsed = example.parse_args(["--output_dir", str(workdir / f"snap-{tag}"), "--max_steps",
                                     str(max_steps), "--save_steps", str(save_steps), "--size",
                                     args.size, "--rlguard", "off", "--snapshots", "off"])  # fmt: skip
        return example.build_trainer(parsed)

    timer = SaveTimer()
    trl = trainer_for("trl", save_steps=1)
    trl.add_callback(timer)
    trl.train()
    segment = Path("/dev/shm") / f"rlguard-bench-{os.getpid()}"
    os.environ[ENV_SNAPSHOT_SHM] = str(segment)
    try:
        rank_dir(segment, 0).mkdir(parents=True)
        write_owner(segment, os.getpid())
        snap = trainer_for("mem", save_steps=10 * steps)
        callback = enable_snapshots(snap, run_dir=workdir / "snap-run", rank=0)
        blocking: list[float] = []
        original = callback.take

        def take(step: int) -> None:
            original(step)
            blocking.append(callback.last.blocking_seconds if callback.last else float("nan"))

        callback.take = take  # type: ignore[method-assign]
        snap.train()
        step_s = median_step(workdir / "snap-mem")
        snap_ms, save_ms = statistics.median(blocking) * 1e3, statistics.median(timer.saves) * 1e3
        print(f"snapshot blocking {snap_ms:.1f} ms per step = {snap_ms / 1e3 / step_s:.2%} of the "
              f"{step_s:.3f} s median step (target <= 5 %); TRL's save every step "
              f"{save_ms:.1f} ms: {save_ms / snap_ms:.1f}x longer (target >= 10x); "
              f"{len(blocking)} snapshots, {len(timer.saves)} saves")  # fmt: skip
        began = time.perf_counter()
        target = resume_dir(workdir / "snap-mem", steps)
        materialize_resume(target, [rank_dir(segment, 0)])
        written = time.perf_counter() - began
        trainer_for("mem", save_steps=10 * steps).train(resume_from_checkpoint=str(target))
        from_memory = time.perf_counter() - began
    finally:
        shutil.rmtree(segment, ignore_errors=True)
    began = time.perf_counter()
    checkpoint = workdir / "snap-trl" / f"checkpoint-{steps}"
    trainer_for("trl", save_steps=1).train(resume_from_checkpoint=str(checkpoint))
    from_disk = time.perf_counter() - began
    print(f"restore from memory {from_memory:.2f} s (of which {written:.2f} s writing the "
          f"snapshot in the Trainer's layout) vs TRL's resume_from_checkpoint from disk "
          f"{from_disk:.2f} s: {from_disk / from_memory:.2f}x (target >= 5x); both include the "
          f"Trainer's own start of train()")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fault-every", type=int, default=10)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--size", choices=("full", "tiny"), default="full")
    p.add_argument("--real-step-seconds", type=float, default=30.0)
    p.add_argument("--overhead-steps", type=int, default=12)
    p.add_argument(
        "--standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="RLGuard way: a warm standby (torch, transformers, trl imported) takes over a restart",
    )
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument(
        "--only-snapshot-cost",
        action="store_true",
        help="only the snapshot-against-save and restore measurements (one process, no faults)",
    )
    args = p.parse_args()
    if args.steps < 2 or not 1 <= args.fault_every < args.steps or args.save_steps < 1:
        p.error("need --steps >= 2, 1 <= --fault-every < --steps and --save-steps >= 1")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ettr-trl-"))
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    print(
        f"workdir {workdir}; {args.steps} steps, size {args.size}, a fault every {args.fault_every}"
    )
    if args.only_snapshot_cost:
        measure_snapshot_cost(workdir, args)
        return 0

    stack = ScaledStack(workdir, free_port(), job="clean", schedule=None)
    stack.restarts_per_rank = len(range(args.fault_every, args.steps, args.fault_every)) + 1
    try:
        stack.start_server()
        subprocess.run([sys.executable, "-m", "integrations.launch", "write-hook",
                        str(workdir / "launcher-hook"), "--run-root", str(stack.run_root)],
                       cwd=ROOT, env=stack._env(), check=True, timeout=60)  # fmt: skip
        clean = run_rlguard(stack, "clean", args, faults=False)
        step_s = median_step(clean["out"])
        stack.factor = step_s / args.real_step_seconds
        # The server reads its policy at start: start it again with the scaled limits.
        stack.stop_one("server")
        stack.start_server()
        subprocess.run([sys.executable, "-m", "integrations.launch", "write-hook",
                        str(workdir / "launcher-hook"), "--run-root", str(stack.run_root)],
                       cwd=ROOT, env=stack._env(), check=True, timeout=60)  # fmt: skip
        watchdog = WATCHDOG_S * stack.factor
        print(f"clean median step {step_s:.3f} s; scale factor {stack.factor:.4f} "
              f"(= step / {args.real_step_seconds:g} s): watchdog {watchdog:.1f} s, "
              f"hang_min_seconds {max(3.0, HANG_MIN_S * stack.factor):.1f} s")  # fmt: skip
        guarded = run_rlguard(stack, "rlguard", args, faults=True)
    finally:
        stack.stop()
    shell = run_shell_retry(workdir, args, watchdog)

    print(f"{'way':12s} {'wall s':>8s} {'ETTR':>6s} {'faults':>6s}")
    for name, result in (("clean", clean), ("rlguard", guarded), ("shell-retry", shell)):
        ratio = 0.0 if result.get("crash_loop") else clean["wall"] / result["wall"]
        print(f"{name:12s} {result['wall']:8.1f} {ratio:6.3f} {len(result['faults']):6d}")
    if shell.get("crash_loop"):
        print(
            f"shell-retry did not finish: it resumed from the torn {shell['crash_loop']} "
            f"four times in a row and was stopped (ETTR 0; a person has to step in)"
        )
    ettr = clean["wall"] / guarded["wall"]
    shell_ettr = 0.0 if shell.get("crash_loop") else clean["wall"] / shell["wall"]
    print(
        f"ETTR rlguard {ettr:.3f} (target >= 0.85): {'met' if ettr >= 0.85 else 'NOT met'}; "
        f"shell-retry {shell_ettr:.3f}"
    )
    print_timeline("rlguard", guarded)
    print_timeline("shell-retry", shell)
    measure_overhead(workdir, args)
    measure_snapshot_cost(workdir, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
