"""``benchmarks/ettr.py --rollout-engine vllm``: the reference job on real vLLM engines.

Two parts, each against a baseline measured in the same invocation:

1. **refit**: one engine, the job's weights published by :mod:`recovery.transfer` and loaded by
   the engine's worker extension (``rlguard_refit``), side by side with vLLM reloading the same
   weights from a Hugging Face directory on disk (``Worker.reload_weights(weights_path=...)``,
   through ``rlguard_load_from_disk``). ``--rounds`` of each, medians, ratio (target >= 2x).
2. **healing** (not with ``--refit-only``): the job under the real stack (embedded ``rlguard up``:
   server, policy engine, Celery worker; a node agent; the launcher as the hook) with ``kill -9``
   of one engine's Worker every ``--fault-every`` steps, alternating between the two engines,
   healed by RLGuard's ``restart_role``. Per fault: seconds from the kill to quarantine (the
   router saw it), to the incident (the server saw it), to the replacement engine up (warm: the
   standby woken from ``/sleep``; cold: a new engine), to the refit and to re-admission at the
   trainer's version; the job's step throughput while an engine was out against a clean run's.
   A first fault is healed by the warm standby, and a fault arriving before a new standby is up
   by a cold start: both kinds are printed as they happened.

Anchors printed beside the figures: NeMo-RL detects a dead engine in ~15 s (5 s probes x 3),
slime in up to ~60 s; a vLLM engine restart costs 35-280 s on GPUs (vLLM #20264, #19824).
Targets: dead engine detected <= 2 s; a warm standby serving current weights <= 3 s + the
refit's transfer time; refit >= 2x faster than the reload from disk.

    .venv/bin/python benchmarks/ettr.py --rollout-engine vllm --refit-only --rounds 5
    .venv/bin/python benchmarks/ettr.py --rollout-engine vllm --steps 30 --fault-every 10
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from app.cli.demo import DemoStack
from integrations.vllm.client import Completion, EngineClient
from integrations.vllm.server import EngineSettings, start_server
from integrations.vllm.tiny_model import TinyModelSpec, save_tiny_model
from integrations.vllm.worker_extension import specs_of
from recovery.transfer import (
    InMemoryRegistry,
    RegistryClient,
    RegistryServer,
    WeightPublisher,
    make_transport,
)
from workload.chaos import Fault, inject
from workload.engines import records
from workload.engines.engine_host import EXTENSION
from workload.engines.lm_task import load_policy
from workload.job import RunDir, read_events, read_json

# --wait-engines: both runs start on the whole fleet (under load an engine may come up tens of
# seconds after the other, and the job would otherwise run its steps on one).
JOB_ARGS = (
    "--rollout-engine",
    "vllm",
    "--group-size",
    "4",
    "--prompts-per-worker",
    "2",
    "--wait-engines",
)
# Two rollout workers, each 2 prompts x a group of 4 per step.
SAMPLES_PER_STEP = 2 * 2 * 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- part 1: refit through RLGuard's transfer vs the engine's reload from disk ---------------


def measure_refit(
    workdir: Path, spec: TinyModelSpec, rounds: int, transport: str
) -> dict[str, Any]:
    model_dir = save_tiny_model(workdir / "model", spec)
    server = start_server(
        model_dir,
        settings=EngineSettings(worker_extension_cls=EXTENSION, max_model_len=64),
        log_path=workdir / "refit-engine.log",
    )
    registry = RegistryServer(InMemoryRegistry())
    publisher = WeightPublisher(
        "policy",
        transport=make_transport(transport),
        registry=RegistryClient(registry.address, timeout=5.0),
        lease_s=10.0,
    )
    try:
        server.wait_healthy(300)
        client = EngineClient(server.url, server.model_name, timeout=120.0)
        policy = load_policy(model_dir)
        times: dict[str, list[float]] = {
            k: []
            for k in (
                "refit_s",
                "disk_s",
                "save_s",
                "publish_s",
                "transfer_s",
                "commit_wait_s",
                "load_s",
                "worker_s",
                "noop_rpc_s",
                "call_s",
                "stream_s",
                "plan_s",
                "copy_s",
                "process_s",
                "disk_worker_s",
            )
        }
        nbytes, paths, max_diff = 0, set(), 0.0
        for version in range(1, rounds + 1):
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            tensors = {n: p.detach().clone() for n, p in policy.named_parameters()}
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            started = time.monotonic()  # what any call to the engine's workers costs, here and now
            client.collective_rpc("rlguard_weight_version", timeout=30.0)
            times["noop_rpc_s"].append(time.monotonic() - started)
            started = time.monotonic()
            publisher.publish(2 * version, tensors)
            times["publish_s"].append(time.monotonic() - started)
            called = time.monotonic()
            [done] = client.collective_rpc(
                "rlguard_refit",
                {
                    "registry": registry.address,
                    "version": 2 * version,
                    "transport": transport,
                    "specs": specs_of(tensors),
                    "timeout": 120.0,
                },
                timeout=120.0,
            )
            times["refit_s"].append(time.monotonic() - started)
            times["call_s"].append(time.monotonic() - called)
            for name in (
                "transfer_s",
                "commit_wait_s",
                "load_s",
                "worker_s",
                "stream_s",
                "plan_s",
                "copy_s",
                "process_s",
            ):
                times[name].append(float(done.get(name, 0.0)))
            paths.add(str(done["load_path"]))
            refit_sample = _sample(client)
            publisher.retire(2 * version)
            # The same weights, on disk as the trainer's checkpoint would hold them.
            on_disk = workdir / f"weights-v{version}"
            saving = time.monotonic()
            policy.save_pretrained(on_disk)  # type: ignore[operator]  # a PreTrainedModel's
            times["save_s"].append(time.monotonic() - saving)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(model_dir / name, on_disk / name)
            started = time.monotonic()
            [loaded] = client.collective_rpc(
                "rlguard_load_from_disk", str(on_disk), 2 * version + 1, timeout=120.0
            )
            times["disk_s"].append(time.monotonic() - started)
            times["disk_worker_s"].append(float(loaded["load_s"]))
            disk_sample = _sample(client)
            # Both paths must serve the same model: the same seeded request, the same answer.
            if refit_sample.token_ids != disk_sample.token_ids:
                raise RuntimeError(
                    f"round {version}: the refit and the reload from disk sample different tokens"
                )
            max_diff = max(
                max_diff,
                *(
                    abs(a - b)
                    for a, b in zip(refit_sample.logprobs, disk_sample.logprobs, strict=True)
                ),
            )
            shutil.rmtree(on_disk)
        best = max(d / r for d, r in zip(times["disk_s"], times["refit_s"], strict=True))
        return {
            "bytes": nbytes,
            "rounds": rounds,
            "transport": transport,
            "best_ratio": best,
            "load_path": ", ".join(sorted(paths)),
            "max_logprob_diff": max_diff,
            **{name: statistics.median(v) for name, v in times.items()},
        }
    finally:
        publisher.close()
        registry.close()
        server.stop()


def _sample(client: EngineClient) -> Completion:
    client.reset_prefix_cache()
    return client.complete([5, 20, 33, 41, 7, 12], max_tokens=8, seed=11, timeout=60.0)


def print_refit(refit: dict[str, Any], spec: TinyModelSpec) -> None:
    """Part 1's figures, with the time split of the refit."""
    ratio = refit["disk_s"] / refit["refit_s"]
    inside = refit["transfer_s"] + refit["commit_wait_s"] + refit["load_s"]
    print(
        f"refit, hidden {spec.hidden} x {spec.layers} layers ({refit['bytes'] / 2**20:.1f} MiB "
        f"float32, {refit['transport']}, median of {refit['rounds']}): RLGuard publish + transfer "
        f"+ load {refit['refit_s'] * 1000:.1f} ms; vLLM's reload of the same weights from disk "
        f"(Worker.reload_weights(weights_path=...), safetensors from save_pretrained, page cache "
        f"warm) {refit['disk_s'] * 1000:.1f} ms: {ratio:.2f}x (target >= 2x; best round "
        f"{refit['best_ratio']:.2f}x); with the trainer's "
        f"save to disk counted ({refit['save_s'] * 1000:.0f} ms): "
        f"{(refit['disk_s'] + refit['save_s']) / refit['refit_s']:.2f}x; the engine's side "
        f"alone (the refit call against the reload call, neither the publish nor the save): "
        f"{refit['disk_s'] / refit['call_s']:.2f}x",
        flush=True,
    )
    print(
        f"  split: publish (manifest, checksums) {refit['publish_s'] * 1000:.1f} ms, transfer "
        f"{refit['transfer_s'] * 1000:.1f} ms (of which copies and checksums "
        f"{refit['stream_s'] * 1000:.1f} ms, the rest registry calls and connecting), wait for "
        f"the commit {refit['commit_wait_s'] * 1000:.1f} ms, load ({refit['load_path']}) "
        f"{refit['load_s'] * 1000:.1f} ms (plan {refit['plan_s'] * 1000:.1f} ms, copies into "
        f"the parameters {refit['copy_s'] * 1000:.1f} ms, packing layers again "
        f"{refit['process_s'] * 1000:.1f} ms; the reload from disk inside the worker "
        f"{refit['disk_worker_s'] * 1000:.1f} ms), the rest of the call in the worker "
        f"{max(0.0, refit['worker_s'] - inside) * 1000:.1f} ms, the /collective_rpc round "
        f"trip {(refit['refit_s'] - refit['publish_s'] - refit['worker_s']) * 1000:.1f} ms "
        f"(each a median on its own; a call that does nothing takes "
        f"{refit['noop_rpc_s'] * 1000:.1f} ms, the reload from disk pays it too); same seeded "
        f"sample after both, max |d logprob| "
        f"{refit['max_logprob_diff']:.2g}",
        flush=True,
    )


# ---- part 2: healing under the real stack ----------------------------------------------------


def _fire(run: RunDir, kills: list[float], rank: int) -> None:
    # Armed here, fired by the job's router as it sends the engine a request, so the kill
    # always lands mid-request (from outside it would be a matter of luck).
    if (
        records.read_fleet(run).get("engines", {}).get(str(rank), {}).get("state")
        == records.ADMITTED
    ):
        kills.append(time.time())
        inject(run, Fault("kill-engine", rank=rank))


def _cold_due(events: list[dict[str, Any]], since: float) -> bool:
    """The first fault's engine is back and no standby engine is ready (each one that got
    ready was taken by a warm replacement): a fault now is healed by a cold start."""
    back = any(e["kind"] == "engine_readmitted" and e["ts"] >= since for e in events)
    ready = sum(1 for e in events if e["kind"] == "standby_ready" and e.get("engine"))
    taken = sum(
        1 for e in events if e["kind"] == "spawn" and e.get("role") == "rollout" and e.get("warm")
    )
    return back and ready <= taken


def _run(
    stack: DemoStack,
    job: str,
    model_dir: Path,
    steps: int,
    every: int | None,
    extra: tuple[str, ...] = (),
    cold_fault: bool = False,
) -> dict[str, Any]:
    """One run of the job; with ``every`` an engine fault every that many steps (alternating
    engines) and, with ``cold_fault``, one more right after the first fault's engine is back,
    before a new standby is up (healed cold)."""
    stack.job = job
    stack.start_agent()
    launched = time.time()
    stack.start_job(*JOB_ARGS, "--model", str(model_dir), "--timeout", "3000", *extra)
    run = RunDir(stack.run_dir)
    kills: list[float] = []
    scheduled, cold_pending = 0, cold_fault
    try:
        while not run.done.exists():
            if stack.procs["job"].poll() is not None:
                raise RuntimeError(f"job {job} exited; see {run.root}/logs")
            events = read_events(run)
            # Faults count from the step both engines first served (under load the second
            # engine may start long after the job's first step on the first).
            both = _both_admitted(events)
            done = [e["ts"] for e in events if e["kind"] == "step"]
            step = len([t for t in done if both is not None and t >= both])
            if not every or both is None or len(done) >= steps - 2:  # no fault (more) to inject
                time.sleep(0.1)
                continue
            if cold_pending and len(kills) == 1 and step < every * (scheduled + 1):
                if _cold_due(events, kills[0]):
                    _fire(run, kills, 1)  # the other engine, before a standby is back
                    cold_pending = len(kills) == 1
            elif step >= every * (scheduled + 1) and _all_admitted(run):
                # Only on a whole fleet: the engine of the last fault may still be healing.
                before = len(kills)
                _fire(run, kills, scheduled % 2)
                scheduled += len(kills) - before
            time.sleep(0.1)
    finally:
        for name in ("job", "agent"):
            stack.stop_one(name)
    events = read_events(run)
    every_step = sorted(e["ts"] for e in events if e["kind"] == "step")
    both = _both_admitted(events)
    if both is None:
        raise RuntimeError(f"job {job}: the two engines never served at once; see {run.root}")
    steps_ts = [t for t in every_step if t >= both]
    fleet = records.read_fleet(run).get("engines", {})
    return {
        "run": run,
        "wall": steps_ts[-1] - steps_ts[0],
        "steps": steps_ts,
        "per_step": (steps_ts[-1] - steps_ts[0]) / max(1, len(steps_ts) - 1),
        "startup_s": every_step[0] - launched,
        "tokens_per_step": sum(int(v.get("tokens") or 0) for v in fleet.values())
        / max(1, len(every_step)),
    }


def _all_admitted(run: RunDir) -> bool:
    engines = records.read_fleet(run).get("engines", {})
    return bool(engines) and all(v.get("state") == records.ADMITTED for v in engines.values())


def _both_admitted(events: list[dict[str, Any]]) -> float | None:
    """When both engines had been admitted once (None: not yet)."""
    first: dict[int, float] = {}
    for e in events:
        if e["kind"] == "engine_admitted" and e.get("rank") in (0, 1):
            first.setdefault(int(e["rank"]), float(e["ts"]))
    return max(first.values()) if len(first) == 2 else None


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _after(events: list[dict[str, Any]], kind: str, t0: float, rank: int) -> float | None:
    hits = [
        e["ts"] for e in events if e["kind"] == kind and e.get("rank") == rank and e["ts"] >= t0
    ]
    return round(min(hits) - t0, 2) if hits else None


def heal_rows(run: RunDir, stack: DemoStack) -> list[dict[str, Any]]:
    events = read_events(run)
    incidents = stack.incidents()
    rows = []
    for fault in [e for e in events if e["kind"] == "fault"]:
        t0, rank = fault["ts"], fault["rank"]
        spawned = [
            e
            for e in events
            if e["kind"] == "spawn"
            and e.get("role") == "rollout"
            and e.get("rank") == rank
            and e["ts"] >= t0
        ]
        opened = [
            datetime.fromisoformat(i["opened_at"].replace("Z", "+00:00")).timestamp()
            for i in incidents
            if i["subject"].get("role") == "rollout" and str(i["subject"].get("rank")) == str(rank)
        ]
        opened = [o for o in opened if o >= t0]
        warm = bool(spawned and spawned[0].get("warm"))
        if warm:
            # A standby still starting its engine when it was taken is no warm start.
            at = spawned[0]["ts"]
            ready = sum(
                1
                for e in events
                if e["kind"] == "standby_ready" and e.get("engine") and e["ts"] < at
            )
            taken = sum(
                1
                for e in events
                if e["kind"] == "spawn"
                and e.get("role") == "rollout"
                and e.get("warm")
                and e["ts"] < at
            )
            warm = ready > taken
        rows.append(
            {
                "rank": rank,
                "ts": t0,
                "warm": warm,
                "quarantine_s": _after(events, "engine_quarantined", t0, rank),
                "incident_s": round(min(opened) - t0, 2) if opened else None,
                "replaced_s": round(spawned[0]["ts"] - t0, 2) if spawned else None,
                "up_s": _after(events, "engine_up", t0, rank),
                "refit_s": _after(events, "engine_refit", t0, rank),
                "readmitted_s": _after(events, "engine_readmitted", t0, rank),
            }
        )
    return rows


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def print_faults(rows: list[dict[str, Any]]) -> None:
    """Per fault: when each stage was reached after the kill, then the stages' own lengths."""
    print(
        "per engine fault (kill -9 of its Worker mid-request), seconds after the kill: "
        "detect = the router quarantines it (the server's incident beside it), replace = to "
        "the replacement engine answering (warm: the standby woken from /sleep; cold: a new "
        "engine, or a standby taken while its engine was still starting), refit = pull and load "
        "of the trainer's version, re-admit = to the router admitting it at that version"
    )
    print(
        f"{'rank':>4} {'kind':>5} {'detect':>7} {'incident':>9} {'replace':>8} {'refit':>6} "
        f"{'re-admit':>9} {'total':>6}"
    )
    for r in rows:
        print(
            f"{r['rank']:>4} {'warm' if r['warm'] else 'cold':>5} {fmt(r['quarantine_s']):>7} "
            f"{fmt(r['incident_s']):>9} {fmt(_minus(r['up_s'], r['quarantine_s'])):>8} "
            f"{fmt(_minus(r['refit_s'], r['up_s'])):>6} "
            f"{fmt(_minus(r['readmitted_s'], r['refit_s'])):>9} {fmt(r['readmitted_s']):>6}"
        )
    for kind in (True, False):
        done = [
            r["readmitted_s"] for r in rows if r["warm"] is kind and r["readmitted_s"] is not None
        ]
        if done:
            print(
                f"  {'warm standby' if kind else 'cold start'}: fault to serving current weights "
                f"{statistics.median(done):.2f} s (median of {len(done)})"
            )
    if not any(r["warm"] for r in rows) or all(r["warm"] for r in rows):
        print("  (this run healed every fault the same way: --cold-fault forces one cold start)")


def print_throughput(
    rows: list[dict[str, Any]],
    steps: list[float],
    clean_step: float,
    tokens_per_step: float,
    samples_per_step: int,
) -> None:
    """The job's rollout throughput while an engine was out, against the clean run's."""
    inside, secs = 0, 0.0
    for r in rows:
        if r["readmitted_s"] is None:
            continue
        inside += len([t for t in steps if r["ts"] <= t <= r["ts"] + r["readmitted_s"]])
        secs += r["readmitted_s"]
    if not secs:
        print("throughput while an engine was out: no engine was re-admitted")
        return
    rate, clean = inside / secs, 1 / clean_step
    print(
        f"rollout throughput while an engine was out ({secs:.1f} s in all): "
        f"{rate * samples_per_step:.1f} samples/s, {rate * tokens_per_step:.0f} tokens/s against "
        f"the clean run's {clean * samples_per_step:.1f} samples/s, {clean * tokens_per_step:.0f} "
        f"tokens/s ({rate / clean:.0%}; steps completed in the window, {tokens_per_step:.0f} "
        f"tokens and {samples_per_step} samples a step)"
    )


def print_ettr(
    faulty: dict[str, Any],
    rows: list[dict[str, Any]],
    startup_s: float,
    every: int,
    clean_step: float,
) -> None:
    """ETTR of the run with faults, against a whole-job restart of the same faults (computed).

    On this host the engines share the same CPU cores, so the job's pace hardly depends on how
    many engines are up and two runs' walls differ by the machine's load more than by the
    faults: the time lost is taken inside the run, as the steps' lateness while an engine was
    out (each step gap over the run's median step, counted when it overlaps a fault's window)."""
    steps, per_step = faulty["steps"], faulty["per_step"]
    gaps = list(zip(steps, steps[1:], strict=False))
    median_gap = statistics.median(b - a for a, b in gaps) if gaps else per_step
    windows = [(r["ts"], r["ts"] + (r["readmitted_s"] or 60.0)) for r in rows]
    lost = sum(
        max(0.0, b - a - median_gap)
        for a, b in gaps
        if any(a < hi and b > lo for lo, hi in windows)
    )
    wall = faulty["wall"]
    # The whole-job restart, computed from this run's measured figures (not run): per fault
    # NeMo-RL's ~15 s to notice a dead engine, the job's own measured cold start (its engines
    # included) and the step in flight redone (the reference job snapshots every step).
    whole_lost = len(rows) * (15.0 + startup_s + clean_step)
    print(
        f"ETTR with {len(rows)} engine faults in {len(steps)} steps (every {every} and "
        f"--cold-fault's): RLGuard {(wall - lost) / wall:.3f} ({lost:.1f} s of {wall:.1f} s "
        f"lost to the faults); a whole-job restart of the same faults "
        f"{wall / (wall + whole_lost):.3f} (computed, not run: per fault 15 s to notice "
        f"(NeMo-RL's probes) + the job's measured cold start {startup_s:.1f} s + one step "
        f"redone {clean_step:.2f} s)"
    )


def report_healing(
    args: argparse.Namespace,
    clean: dict[str, Any],
    faulty: dict[str, Any],
    rows: list[dict[str, Any]],
) -> None:
    """Part 2's figures, each with its anchor."""
    clean_step = clean["per_step"]
    print(
        f"measured from the step both engines first served: clean {len(clean['steps'])} steps "
        f"in {clean['wall']:.1f} s ({clean_step:.2f} s a step; the job's cold start to its "
        f"first step {clean['startup_s']:.1f} s); with faults {len(faulty['steps'])} steps in "
        f"{faulty['wall']:.1f} s ({faulty['per_step']:.2f} s a step)"
    )
    print_faults(rows)
    print_throughput(rows, faulty["steps"], clean_step, clean["tokens_per_step"], SAMPLES_PER_STEP)
    print_ettr(faulty, rows, clean["startup_s"], args.fault_every, clean_step)
    same = (read_json(faulty["run"].final) or {}).get("params_sha256") == (
        read_json(clean["run"].final) or {}
    ).get("params_sha256")
    print(f"final parameters equal to the clean run's: {same}")
    print(
        "anchors: NeMo-RL detects a dead engine in ~15 s (5 s probes x 3), slime in up to "
        "~60 s; a vLLM engine restart costs 35-280 s on GPUs (vLLM #20264, #19824). Targets: "
        "detect <= 2 s, a warm standby serving current weights <= 3 s + the refit's transfer"
    )


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/ettr.py --rollout-engine vllm")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--fault-every", type=int, default=10)
    p.add_argument("--rounds", type=int, default=9, help="refit rounds (part 1)")
    p.add_argument("--hidden", type=int, default=256, help="the refit model's hidden size")
    p.add_argument("--layers", type=int, default=4, help="the refit model's layers")
    p.add_argument(
        "--transport",
        choices=("tcp", "shm"),
        default="shm",
        help="part 1's transport (shm: the trainer and the engine share a host)",
    )
    p.add_argument("--refit-only", action="store_true")
    p.add_argument(
        "--cold-fault",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one more fault right after the first fault's engine is back, before a "
        "new standby is up, so the run heals one fault cold (default: on)",
    )
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if not 2 <= args.fault_every < args.steps:
        p.error(f"--fault-every {args.fault_every} must be in 2..steps-1")
    workdir = Path(tempfile.mkdtemp(prefix="rlguard-ettr-vllm-"))
    try:
        spec = TinyModelSpec(
            hidden=args.hidden, layers=args.layers, heads=max(2, args.hidden // 32)
        )
        refit = measure_refit(workdir / "refit", spec, args.rounds, args.transport)
        print_refit(refit, spec)
        if args.refit_only:
            return 0
        model_dir = save_tiny_model(workdir / "job-model")
        stack = DemoStack(
            workdir / "stack", _free_port(), steps=args.steps, decode_ms=0.0, schedule=None
        )
        try:
            stack.start_server()
            clean = _run(stack, "clean", model_dir, args.steps, None, ("--no-standby",))
            faulty = _run(
                stack, "faulty", model_dir, args.steps, args.fault_every, cold_fault=args.cold_fault
            )
            rows = heal_rows(faulty["run"], stack)
        finally:
            stack.stop()
        report_healing(args, clean, faulty, rows)
        return 0
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
