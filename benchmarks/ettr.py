"""ETTR (effective training time ratio) of the reference GRPO job under faults, three ways.

One invocation runs the same job of ``--steps`` steps:

1. **clean**: no fault;
2. **rlguard**: a fault every ``--fault-every`` steps (alternately ``kill -9`` of a rollout worker
   mid-batch and of the trainer), recovered by RLGuard: the launcher marks the dead process
   EXITED in its heartbeat → agent → server → policy engine (heartbeat_lost, medium) → Celery
   worker → launcher hook → role-local restart (a warm standby of the role takes over), per-step
   checkpoints through the coordinator; meanwhile the surviving rollout worker generates the dead
   worker's batch (same seeds, so the same batch);
3. **whole-job**: the same faults handled the common way: the launcher restarts every process
   from the latest checkpoint as soon as one dies (``--on-failure restart-job``, cold starts).

The server (embedded mode) runs throughout; the agent watches the clean and the RLGuard runs.
Printed per way: wall time, ETTR = clean wall time / this wall time, lost rollouts (samples whose
WAL entry was EXECUTING when their worker died), mean detection delay (fault → incident for
RLGuard, fault → launcher noticing for whole-job), mean recovery time (fault → first completed
step after the restart), and the recovery-quality checks: batches consumed are hash-identical to
the clean run's, step throughput after recovery within 5 % of before, final parameters equal to
the clean run's. The RobustRL paper reports ETTR > 0.80 for role-local recovery and about 0.60
for whole-job restart at a similar fault rate; our target is >= 0.90.

For the RLGuard way it also prints where each fault's time went: kill → the launcher saw the
exit → incident opened → recovery action started → launcher hook request → replacement process
ready → first step done after the fault, and the time lost (the fault's window, from the last
step before it to the next fault, against the clean run's median step time).

    .venv/bin/python benchmarks/ettr.py                      # 60 steps, a fault every 10
    .venv/bin/python benchmarks/ettr.py --steps 20 --fault-every 5
    .venv/bin/python benchmarks/ettr.py --ray                # the Ray-mode job: benchmarks/_ettr_ray.py
    .venv/bin/python benchmarks/ettr.py --rollout-engine vllm  # real vLLM engines: benchmarks/_ettr_vllm.py
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.demo import DemoStack  # noqa: E402
from workload.job import RunDir, read_events, read_json  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def schedule(steps: int, every: int) -> list[dict[str, Any]]:
    out = []
    for i, step in enumerate(range(every, steps, every)):
        role = "rollout" if i % 2 == 0 else "trainer"
        out.append(
            {
                "at_step": step,
                "delay": 0.6,
                "fault": "kill",
                "role": role,
                "rank": 1 if role == "rollout" else 0,
            }
        )
    return out


def run_job(
    stack: DemoStack,
    job: str,
    *,
    faults: list[dict[str, Any]] | None,
    agent: bool,
    extra: tuple[str, ...] = (),
    timeout: float = 1800.0,
) -> RunDir:
    stack.job, stack.schedule = job, faults
    if agent:
        stack.start_agent()
    started = time.monotonic()
    stack.start_job(*extra)
    stack.start_chaos()
    run = RunDir(stack.run_dir)
    try:
        while not any(e["kind"] == "job_done" for e in read_events(run)):
            if stack.procs["job"].poll() is not None:
                raise RuntimeError(
                    f"job {job} exited {stack.procs['job'].returncode}; see {run.root}/logs"
                )
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"job {job} did not finish within {timeout:g}s")
            time.sleep(0.2)
    finally:
        for name in ("chaos", "job", "agent"):
            stack.stop_one(name)
    return run


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def step_times(run: RunDir) -> list[float]:
    return sorted(e["ts"] for e in read_events(run) if e["kind"] == "step")


def _first(
    ev: list[dict[str, Any]], kind: str, origin: float, start: float, end: float, **match: Any
) -> float | None:
    """Seconds from ``origin`` to the first ``kind`` event in [start, end) matching ``match``."""
    hits = [
        e["ts"]
        for e in ev
        if e["kind"] == kind
        and start <= e["ts"] < end
        and all(e.get(k) == v for k, v in match.items())
    ]
    return min(hits) - origin if hits else None


def breakdown(run: RunDir, stack: DemoStack, clean_step_s: float) -> list[dict[str, Any]]:
    """Per fault, seconds from the kill to each stage of its recovery (None: not seen)."""
    ev = read_events(run)
    faults = [e for e in ev if e["kind"] == "fault"]
    steps = step_times(run)
    done = max(e["ts"] for e in ev if e["kind"] == "job_done")
    incidents = [i for i in stack.incidents() if i["job"] == run.root.name]
    rows = []
    for n, f in enumerate(faults):
        t0, role, rank = f["ts"], f["role"], f["rank"]
        end = faults[n + 1]["ts"] if n + 1 < len(faults) else done

        mine = [
            i
            for i in incidents
            if i["subject"].get("role") == role and t0 - 1 <= _ts(i["opened_at"]) < end
        ]
        opened = started = None
        if mine:
            inc = min(mine, key=lambda i: _ts(i["opened_at"]))
            opened = _ts(inc["opened_at"]) - t0
            acts = [a for a in stack.incident(inc["id"])["actions"] if a.get("started_at")]
            if acts:
                started = min(_ts(a["started_at"]) for a in acts) - t0
        spawn = _first(ev, "spawn", t0, t0, end, role=role)
        ready = None
        if spawn is not None:
            kind, match = (
                ("trainer_start", {}) if role == "trainer" else ("rollout_start", {"rank": rank})
            )
            ready = _first(ev, kind, t0, t0 + spawn, end, **match)
        before = [t for t in steps if t < t0]
        window_start = before[-1] if before else t0
        completed = [t for t in steps if window_start < t <= end]
        lost = (completed[-1] if completed else end) - window_start - len(completed) * clean_step_s
        # The fault alone, as the server's ledger defines it: last step before the kill ->
        # first step after it, less that step's own (clean) time.
        to_step = (completed[0] if completed else end) - window_start - clean_step_s
        rows.append(
            {
                "fault": f"{role}-{rank} @{f.get('step')}",
                "exit_seen": _first(ev, "child_exit", t0, t0, end, role=role),
                "incident": opened,
                "action": started,
                "hook": _first(ev, "hook_request", t0, t0, end),
                "warm": next(
                    (e.get("warm") for e in ev if e["kind"] == "spawn" and e["ts"] >= t0), None
                ),
                "ready": ready,
                "step": next((t - t0 for t in steps if t > t0), None),
                "lost_s": lost,
                "lost_to_step_s": max(0.0, to_step),
            }
        )
    return rows


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def ledger(stack: DemoStack, run: RunDir) -> dict[str, Any]:
    """The server's goodput ledger of ``run`` over the same span as this benchmark's wall time
    (first spawn -> job done), read from ``GET /api/v1/jobs/{job}/goodput``."""
    ev = read_events(run)
    first = min(e["ts"] for e in ev if e["kind"] == "spawn")
    done = max(e["ts"] for e in ev if e["kind"] == "job_done")
    r = stack.api(
        "GET",
        f"/api/v1/jobs/{run.root.name}/goodput",
        params={"since": _iso(first), "until": _iso(done)},
    )
    r.raise_for_status()
    return dict(r.json())


def print_breakdown(rows: list[dict[str, Any]]) -> None:
    cols = ("exit_seen", "incident", "action", "hook", "ready", "step", "lost_s", "lost_to_step_s")
    print("per fault (rlguard), seconds after the kill:")
    print(f"{'fault':<16}" + "".join(f"{c:>10}" for c in cols) + f"{'warm':>6}")
    for r in rows:
        cells = "".join(f"{'-' if r[c] is None else f'{r[c]:.2f}':>10}" for c in cols)
        print(f"{r['fault']:<16}{cells}{str(r['warm']):>6}")
    if rows:
        print(
            f"{'mean':<16}"
            + "".join(
                f"{statistics.mean(v) if (v := [r[c] for r in rows if r[c] is not None]) else 0:>10.2f}"
                for c in cols
            )
        )


def analyse(run: RunDir, clean: RunDir | None, stack: DemoStack | None) -> dict[str, Any]:
    ev = read_events(run)
    first = min(e["ts"] for e in ev if e["kind"] == "spawn")
    done = max(e["ts"] for e in ev if e["kind"] == "job_done")
    faults = [e for e in ev if e["kind"] == "fault"]
    steps = sorted((e["ts"], e["step"]) for e in ev if e["kind"] == "step")
    out: dict[str, Any] = {
        "wall_s": done - first,
        "faults": len(faults),
        "lost_rollouts": sum(e.get("samples", 0) for e in ev if e["kind"] == "lost_rollout"),
        "final": read_json(run.final) or {},
    }
    detections, recoveries, ratios = [], [], []
    incidents = stack.incidents() if stack is not None else []
    for n, f in enumerate(faults):
        role = f.get("role")
        next_fault = faults[n + 1]["ts"] if n + 1 < len(faults) else float("inf")
        if stack is not None:
            opened = [
                _ts(i["opened_at"])
                for i in incidents
                if i["job"] == run.root.name
                and i["subject"].get("role") == role
                and _ts(i["opened_at"]) >= f["ts"] - 1
            ]
            if opened:
                detections.append(min(opened) - f["ts"])
        else:
            noticed = [
                e["ts"]
                for e in ev
                if e["kind"] in ("child_exit", "child_hung") and e["ts"] >= f["ts"]
            ]
            if noticed:
                detections.append(min(noticed) - f["ts"])
        respawn = [e["ts"] for e in ev if e["kind"] == "spawn" and e["ts"] > f["ts"]]
        if respawn:
            after = [t for t, _s in steps if t > min(respawn)]
            if after:
                recoveries.append(after[0] - f["ts"])
        before = [t for t, _s in steps if t < f["ts"]][-4:]
        # Steady state after the recovery, before the next fault: skip the first step after it.
        later = [t for t, _s in steps if respawn and min(respawn) < t < next_fault][1:5]
        if len(before) >= 2 and len(later) >= 2:
            rate_before = (len(before) - 1) / (before[-1] - before[0])
            rate_after = (len(later) - 1) / (later[-1] - later[0])
            ratios.append(rate_after / rate_before)
    out["detection_s"] = statistics.mean(detections) if detections else None
    out["recovery_s"] = statistics.mean(recoveries) if recoveries else None
    out["throughput_ratios"] = ratios
    if clean is not None:
        mine = {(e["step"], e["batch"]): e["sha256"] for e in ev if e["kind"] == "consumed"}
        ref = {
            (e["step"], e["batch"]): e["sha256"]
            for e in read_events(clean)
            if e["kind"] == "consumed"
        }
        out["batches_identical"] = mine == ref
        out["params_equal"] = out["final"].get("params_sha256") == (
            read_json(clean.final) or {}
        ).get("params_sha256")
    return out


def main() -> int:
    if "--ray" in sys.argv[1:]:  # the Ray-mode job (issue 19): its own module, its own options
        import _ettr_ray

        return _ettr_ray.main([a for a in sys.argv[1:] if a != "--ray"])
    engine = [a for a in sys.argv[1:] if a.startswith("--rollout-engine")]
    if engine:  # real vLLM engines as the rollout role (issue 44): benchmarks/_ettr_vllm.py
        argv = sys.argv[1:]
        at = argv.index(engine[0])
        value = engine[0].partition("=")[2] or (argv[at + 1] if at + 1 < len(argv) else "")
        if value != "vllm":
            sys.exit(f"--rollout-engine {value!r}: only vllm has a benchmark of its own")
        rest = argv[:at] + argv[at + (1 if "=" in engine[0] else 2) :]
        import _ettr_vllm

        return _ettr_vllm.main(rest)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fault-every", type=int, default=10)
    p.add_argument("--decode-ms", type=float, default=15.0)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if args.steps < 4:
        p.error(f"--steps {args.steps} is too short (at least 4)")
    if not 2 <= args.fault_every < args.steps:
        p.error(
            f"--fault-every {args.fault_every} must be in 2..steps-1 (a fault in step 0-1 is a heavy first-step anomaly)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="rlguard-ettr-"))
    stack = DemoStack(
        workdir, free_port(), steps=args.steps, decode_ms=args.decode_ms, schedule=None
    )
    faults = schedule(args.steps, args.fault_every)
    results: dict[str, dict[str, Any]] = {}
    try:
        stack.start_server()
        print(
            f"server up; {args.steps} steps, faults at steps {[f['at_step'] for f in faults]} "
            f"({', '.join(f['role'] for f in faults)})",
            flush=True,
        )
        clean = run_job(stack, "clean", faults=None, agent=True)
        results["clean"] = analyse(clean, None, None)
        print(f"clean: {results['clean']['wall_s']:.1f} s", flush=True)
        rl = run_job(stack, "rlguard", faults=faults, agent=True)
        results["rlguard"] = analyse(rl, clean, stack)
        clean_steps = step_times(clean)
        clean_step_s = statistics.median(
            b - a for a, b in zip(clean_steps, clean_steps[1:], strict=False)
        )
        rows = breakdown(rl, stack, clean_step_s)
        results["rlguard"]["ledger"] = ledger(stack, rl)
        print(f"rlguard: {results['rlguard']['wall_s']:.1f} s", flush=True)
        wj = run_job(
            stack, "wholejob", faults=faults, agent=False, extra=("--on-failure", "restart-job")
        )
        results["whole-job"] = analyse(wj, clean, None)
        print(f"whole-job: {results['whole-job']['wall_s']:.1f} s", flush=True)
    finally:
        stack.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work directory kept: {workdir}")
    base = results["clean"]["wall_s"]
    print()
    print(
        f"{'way':<10} {'wall s':>8} {'ETTR':>6} {'lost':>5} {'detect s':>9} {'recover s':>10} "
        f"{'batches=':>9} {'params=':>8} {'thr after/before':>17}"
    )
    for name, r in results.items():
        ettr = base / r["wall_s"]
        r["ettr"] = ettr
        thr = ", ".join(f"{x:.2f}" for x in r["throughput_ratios"]) or "-"
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(
            f"{name:<10} {r['wall_s']:>8.1f} {ettr:>6.3f} {r['lost_rollouts']:>5} {fmt(r['detection_s']):>9} "
            f"{fmt(r['recovery_s']):>10} {str(r.get('batches_identical', '-')):>9} "
            f"{str(r.get('params_equal', '-')):>8} {thr:>17}"
        )
    rl, wj = results["rlguard"], results["whole-job"]
    print()
    print(f"clean median step {clean_step_s:.2f} s")
    print_breakdown(rows)
    print()
    print(
        f"ETTR rlguard / ETTR whole-job = {rl['ettr'] / wj['ettr']:.2f}x "
        f"(target: rlguard >= 0.90; RobustRL: role-local > 0.80, whole-job ~0.60)"
    )
    # The same run measured from the job's own event log: its wall time less each fault's
    # time (last step before the kill -> first step after it, less one clean step). The
    # headline ETTR (clean wall / this wall) also holds the run-to-run noise of two separate
    # runs on a shared machine, which no per-job ledger can see.
    own_lost = sum(r["lost_to_step_s"] for r in rows)
    own = (rl["wall_s"] - own_lost) / rl["wall_s"]
    led = rl["ledger"]
    agree = abs(led["ettr"] - own) / own
    print(
        f"ETTR rlguard, same run: from the job's event log {own:.3f} ({own_lost:.1f} s lost to "
        f"{len(rows)} faults in {rl['wall_s']:.1f} s); ledger (GET /api/v1/jobs/rlguard/goodput) "
        f"{led['ettr']:.3f} ({led['lost_seconds']:.1f} s lost in {led['wall_seconds']:.1f} s, "
        f"{len(led['incidents'])} incidents: detect {led['segments']['detect']:.1f}, approve "
        f"{led['segments']['approve']:.1f}, recover {led['segments']['recover']:.1f}, redo "
        f"{led['segments']['redo']:.1f} s); difference {100 * agree:.1f} % "
        f"({'within' if agree <= 0.02 else 'NOT within'} 2 %); headline (clean / this wall) "
        f"{rl['ettr']:.3f}"
    )
    for inc in led["incidents"]:
        print(
            f"  ledger incident {inc['id']} {inc['kind']}: lost {inc['lost_seconds']:.2f} s "
            f"(counted {inc['counted_seconds']:.2f}), segments "
            + ", ".join(f"{k} {v:.2f}" for k, v in inc["segments"].items())
        )
    within = [abs(x - 1) <= 0.05 for x in rl["throughput_ratios"]]
    print(
        f"quality (rlguard): batches reused unchanged={rl['batches_identical']}, "
        f"final params equal={rl['params_equal']}, throughput within 5% after {sum(within)}/{len(within)} recoveries"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
