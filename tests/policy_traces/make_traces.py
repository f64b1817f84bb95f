"""Generate the labelled policy trace corpus (run: python -m tests.policy_traces.make_traces).

Each trace is a small simulated cluster (3 nodes × 2 GPUs; one job with two trainer ranks on
n0 and one rollout rank on each of n1 and n2) sending one ingest batch per node per second,
exactly in the ingest body format, with one fault injected (or a must-not-fire situation).
The agent behaviour is modelled after docs/metrics.md: a dead process keeps its stale heartbeat
(the participant's ``ts`` stops moving) and ``rollout_tokens_per_second`` is only sent when a
new heartbeat arrives; a silent node sends nothing at all.

Next to each ``<name>.jsonl.gz`` a ``<name>.labels.json`` lists the faults that must be found
(kind, subject, start time, the configured detection window, the tier when it must be heavy).
"""

from __future__ import annotations

import gzip
import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recovery.protocol.metric_names import CRITICAL_XIDS

HERE = Path(__file__).parent
T0 = 1_700_000_000.0
JOB = "grpo-a"
GPUS = ("0", "1")
PARTICIPANTS = {  # node → [(role, rank)]
    "n0": [("trainer", 0), ("trainer", 1)],
    "n1": [("rollout", 0)],
    "n2": [("rollout", 1)],
}
FINGERPRINT = {
    "python": "3.11.9",
    "torch": "2.4.1",
    "cuda": "12.4",
    "driver": "550.54",
    "hash": "a1b2",
}


@dataclass
class Sim:
    """Mutable simulation state a scenario changes at chosen times."""

    seed: int
    duration: float
    rng: random.Random = field(init=False)
    silent_nodes: dict[str, tuple[float, float]] = field(default_factory=dict)  # node → [from, to)
    step: int = 20
    phase: dict[tuple[str, int], str] = field(default_factory=dict)
    # per-second hook: (t, sim) → None, may change overrides below
    hooks: list[Callable[[float, Sim], None]] = field(default_factory=list)
    gpu_override: dict[tuple[str, str, str], float] = field(
        default_factory=dict
    )  # (node,gpu,metric)
    gpu_missing: set[tuple[str, str]] = field(default_factory=set)  # lost GPUs: only gpu_lost sent
    part_override: dict[tuple[int, str, str], float] = field(
        default_factory=dict
    )  # (rank, role, metric)
    dead: dict[tuple[str, int], float] = field(default_factory=dict)  # (role, rank) → died at
    hb_frozen: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    fingerprints: dict[str, dict[str, str]] = field(default_factory=dict)
    trainer_util: float | None = None  # forced trainer-node GPU utilization
    # Inference engines the agent probes (--engine): node → [(kind, role, rank)]; a trace
    # without engines draws nothing for them, so the older traces stay byte-identical.
    engines: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)
    engine_down: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    engine_idle: set[tuple[str, int]] = field(default_factory=set)  # up, generating nothing
    # The engine seen level by level (issue 44): its processes, its counters. Off in the older
    # traces (nothing new drawn or sent), which stay byte-identical.
    engine_live: EngineLive | None = None
    # The agent's --slurm-node: what Slurm says of each node (no samples unless slurm is set).
    slurm: bool = False
    slurm_unavailable: dict[str, tuple[float, float]] = field(default_factory=dict)  # DOWN/DRAIN
    # Nodes whose clock is off: node → seconds behind the server (negative: ahead). Their
    # batches carry the server's receive time (received_at) beside their own stamps.
    clock_behind: dict[str, float] = field(default_factory=dict)
    # GPUs per node where not GPUS (an eight-GPU node), and the agent's per-code XID counters
    # (gpu_xid_events_total{gpu, xid}); empty in the older traces, which stay byte-identical.
    node_gpus: dict[str, tuple[str, ...]] = field(default_factory=dict)
    xid_events: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)
    # Stragglers and engines dead in a live worker: another cluster than PARTICIPANTS (more
    # peers), and samples the older traces do not send (per participant: (sim, role, rank, t,
    # add) → None). Both default to nothing new, so the older traces stay byte-identical.
    layout: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: PARTICIPANTS)
    part_samples: list[Callable[..., None]] = field(default_factory=list)
    # Participants whose step moves on its own (ranks that step independently), else the job's
    # ``step``; empty in the older traces, which stay byte-identical.
    rank_step: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for parts in self.layout.values():
            for role, rank in parts:
                self.phase[(role, rank)] = "TRAIN" if role == "trainer" else "ROLLOUT"


def _silent(sim: Sim, node: str, t: float) -> bool:
    span = sim.silent_nodes.get(node)
    return span is not None and span[0] <= t < span[1]


def _batch(sim: Sim, node: str, t: float, seq: int) -> dict[str, Any]:
    r = sim.rng
    ts = round(t + r.uniform(0.0, 0.2), 3)
    samples: list[dict[str, Any]] = []

    def add(name: str, value: float, **labels: str) -> None:
        samples.append({"name": name, "value": round(value, 3), "ts": ts, "labels": labels})

    for gpu in sim.node_gpus.get(node, GPUS):
        for code, count in sim.xid_events.get((node, gpu), {}).items():
            add("gpu_xid_events_total", count, gpu=gpu, xid=str(code))  # sent for lost GPUs too
        if (node, gpu) in sim.gpu_missing:
            add("gpu_lost", 1, gpu=gpu)
            continue
        if node == "n0":
            util = sim.trainer_util if sim.trainer_util is not None else r.uniform(0.7, 0.95)
        else:
            util = r.uniform(0.3, 0.9)
        defaults = {
            "gpu_utilization_ratio": util,
            "gpu_temperature_celsius": r.uniform(55, 70),
            "gpu_xid_critical_events_total": 0,
            "gpu_xid_last_code": None,
            "gpu_ecc_uncorrected_errors_total": 0,
            "gpu_remapped_rows_failure": 0,
            "gpu_throttle_thermal_active": 0,
            "gpu_throttle_power_active": 0,
            "gpu_lost": 0,
        }
        for name, value in defaults.items():
            value = sim.gpu_override.get((node, gpu, name), value)
            if value is not None:
                add(name, value, gpu=gpu)
    participants = []
    for role, rank in sim.layout[node]:
        labels = {"job": JOB, "role": role, "rank": str(rank)}
        died = sim.dead.get((role, rank))
        alive = died is None or t < died
        frozen = sim.hb_frozen.get((role, rank))
        hb_ts = round(t - r.uniform(0.0, 2.0), 3)  # the reporter rewrites every ~2 s
        if not alive:
            hb_ts = round(died - 1.0, 3)  # type: ignore[operator]
        elif frozen and frozen[0] <= t < frozen[1]:
            hb_ts = round(frozen[0] - 1.0, 3)
        fresh_heartbeat = alive and not (frozen and frozen[0] <= t < frozen[1])

        def val(metric: str, default: float, rank: int = rank, role: str = role) -> float:
            return sim.part_override.get((rank, role, metric), default)

        add("rollout_pending_ratio", val("rollout_pending_ratio", r.uniform(0.0, 0.08)), **labels)
        add("actor_shard_rebuild_count_5m", val("actor_shard_rebuild_count_5m", 0), **labels)
        add(
            "state_log_write_latency_ms",
            val("state_log_write_latency_ms", r.uniform(5, 40)),
            **labels,
        )
        step = sim.rank_step.get((role, rank), sim.step)
        add("train_step", step, **labels)
        add("train_step_failures_total", val("train_step_failures_total", 0), **labels)
        if (rank, role, "train_last_failed_step") in sim.part_override:
            add("train_last_failed_step", val("train_last_failed_step", 0), **labels)
        add("rollout_batch_timeouts_total", val("rollout_batch_timeouts_total", 0), **labels)
        add("state_log_write_errors_total", val("state_log_write_errors_total", 0), **labels)
        add("actor_shard_stale", val("actor_shard_stale", 0), **labels)
        add("participant_heartbeat_age_seconds", t - hb_ts, **labels)
        if role == "rollout" and fresh_heartbeat:
            add(
                "rollout_tokens_per_second",
                val("rollout_tokens_per_second", r.uniform(800, 1500)),
                **labels,
            )
        for sample in sim.part_samples:
            sample(
                sim,
                role,
                rank,
                t,
                lambda name, value, labels=labels, **more: add(name, value, **labels, **more),
            )
        participants.append(
            {
                "job": JOB,
                "role": role,
                "rank": rank,
                "phase": sim.phase[(role, rank)],
                "step": step,
                "ts": hb_ts,
            }
        )
    _engine_samples(sim, node, t, add)
    if sim.slurm:
        span = sim.slurm_unavailable.get(node)
        add("slurm_node_unavailable", 1 if span is not None and span[0] <= t < span[1] else 0)
        add("slurm_jobs_running", 1)
    return {
        "agent_id": f"agent-{node}",
        "node": node,
        "seq": seq,
        "sent_at": round(t + 0.25, 3),
        "samples": samples,
        "participants": participants,
        "fingerprint": sim.fingerprints.get(node, FINGERPRINT) if seq == 1 else None,
    }


def _engine_samples(sim: Sim, node: str, t: float, add: Callable[..., None]) -> None:
    """What the agent's engine collector sends for each engine of ``node`` (docs/metrics.md)."""
    r = sim.rng
    for kind, role, rank in sim.engines.get(node, []):
        labels = {"job": JOB, "role": role, "rank": str(rank), "engine": kind}
        if sim.engine_live is not None:
            sim.engine_live.samples(sim, (role, rank), t, labels, add)
            continue
        span = sim.engine_down.get((role, rank))
        if span is not None and span[0] <= t < span[1]:
            add("rollout_engine_up", 0, **labels)  # the health probe failed: nothing else
            continue
        add("rollout_engine_up", 1, **labels)
        if (role, rank) in sim.engine_idle:
            running, waiting, tokens_per_s = 0, 0, 0.0
        else:
            running, waiting, tokens_per_s = (
                r.randint(16, 32),
                r.randint(0, 2),
                r.uniform(800, 1500),
            )
        add("rollout_engine_requests_running", running, **labels)
        add("rollout_engine_requests_waiting", waiting, **labels)
        add(
            "rollout_engine_kv_cache_usage_ratio", r.uniform(0.2, 0.7) if running else 0.0, **labels
        )
        if running + waiting:
            add("rollout_pending_ratio", waiting / (running + waiting), **labels)
        add("rollout_tokens_per_second", tokens_per_s, **labels)


def simulate(sim: Sim) -> list[dict[str, Any]]:
    out = []
    seqs = dict.fromkeys(sim.layout, 0)
    for second in range(int(sim.duration)):
        t = T0 + second
        for hook in sim.hooks:
            hook(t, sim)
        for node in sim.layout:
            if _silent(sim, node, t):
                continue
            seqs[node] += 1
            batch = _batch(sim, node, t, seqs[node])
            behind = sim.clock_behind.get(node)
            out.append(batch if behind is None else _on_a_wrong_clock(batch, behind))
    return out


def _on_a_wrong_clock(batch: dict[str, Any], behind: float) -> dict[str, Any]:
    """``batch`` as an agent whose clock is ``behind`` seconds late stamps it, with the time
    the server received it (its true send time)."""

    def moved(ts: float) -> float:
        return round(ts - behind, 3)

    return {
        **batch,
        "sent_at": moved(batch["sent_at"]),
        "samples": [{**x, "ts": moved(x["ts"])} for x in batch["samples"]],
        "participants": [{**x, "ts": moved(x["ts"])} for x in batch["participants"]],
        "received_at": batch["sent_at"],
    }


# -- scenarios --------------------------------------------------------------------------------

Scenario = Callable[[int], tuple[Sim, list[dict[str, Any]], str]]


def at(
    start: float, end: float, fn: Callable[[Sim], None], undo: Callable[[Sim], None] | None = None
):
    def hook(t: float, sim: Sim) -> None:
        if T0 + start <= t < T0 + end:
            fn(sim)
        elif undo is not None and t >= T0 + end:
            undo(sim)

    return hook


def exp(
    kind: str,
    start: float,
    window: float,
    tier: str | None = None,
    decision: str = "open",
    **subject: Any,
) -> dict[str, Any]:
    e: dict[str, Any] = {
        "kind": kind,
        "start": T0 + start,
        "window": window,
        "subject": {"job": JOB, **subject} if "job" not in subject else subject,
    }
    if subject.get("job", JOB) is None:
        e["subject"] = {k: v for k, v in subject.items() if k != "job"}
    if tier:
        e["tier"] = tier
    if decision != "open":
        e["decision"] = decision
    return e


def golden(metric: str, kind: str, value: float, window: float, hold: float):
    def make(v: int) -> tuple[Sim, list[dict[str, Any]], str]:
        start = 50 + 7 * v
        role, rank = (("rollout", 0), ("rollout", 1), ("trainer", 1))[v % 3]
        node = {("rollout", 0): "n1", ("rollout", 1): "n2", ("trainer", 1): "n0"}[(role, rank)]
        sim = Sim(seed=100 + v, duration=start + window + hold + 20)
        sim.hooks.append(
            at(
                start,
                start + window + hold,
                lambda s: s.part_override.__setitem__((rank, role, metric), value),
                lambda s: s.part_override.pop((rank, role, metric), None),
            )
        )
        return (
            sim,
            [exp(kind, start, window, role=role, rank=rank, node=node)],
            f"{metric} above warning on {role}-{rank}",
        )

    return make


def counter_event(
    metric: str, kind: str, role: str, rank: int, tier: str | None = None, step_label: bool = False
):
    def make(v: int) -> tuple[Sim, list[dict[str, Any]], str]:
        start = 40 + 9 * v
        sim = Sim(seed=200 + v, duration=start + 40)

        def bump(s: Sim) -> None:
            s.part_override[(rank, role, metric)] = 1
            if step_label:
                s.part_override[(rank, role, "train_last_failed_step")] = s.step

        sim.hooks.append(at(start, 10_000, bump))
        node = {
            ("trainer", 0): "n0",
            ("trainer", 1): "n0",
            ("rollout", 0): "n1",
            ("rollout", 1): "n2",
        }[(role, rank)]
        return (
            sim,
            [exp(kind, start, 0, tier=tier, role=role, rank=rank, node=node)],
            f"{metric} rises once",
        )

    return make


def gpu_event(
    metric: str,
    kind: str,
    value: float,
    window: float,
    node: str,
    gpu: str,
    xid: int | None = None,
    until: float | None = None,
):
    def make(v: int) -> tuple[Sim, list[dict[str, Any]], str]:
        start = 45 + 6 * v
        g = GPUS[(int(gpu) + v) % 2]
        sim = Sim(seed=300 + v, duration=start + window + 40)

        def on(s: Sim) -> None:
            s.gpu_override[(node, g, metric)] = value
            if xid is not None:
                s.gpu_override[(node, g, "gpu_xid_last_code")] = xid

        end = start + until if until is not None else 10_000
        sim.hooks.append(at(start, end, on, lambda s: s.gpu_override.pop((node, g, metric), None)))
        return (
            sim,
            [exp(kind, start, window, job=None, node=node, gpu=g)],
            f"{metric} on {node}/gpu{g}",
        )

    return make


def gpu_lost(v: int):
    start = 50 + 5 * v
    node, g = ("n2", GPUS[v % 2])
    sim = Sim(seed=400 + v, duration=start + 40)
    sim.hooks.append(at(start, 10_000, lambda s: s.gpu_missing.add((node, g))))
    return sim, [exp("gpu_lost", start, 0, job=None, node=node, gpu=g)], "GPU falls off the bus"


def trainer_idle(v: int):
    start = 40 + 10 * v
    sim = Sim(seed=500 + v, duration=start + 300 + 20)
    sim.hooks.append(at(start, 10_000, lambda s: setattr(s, "trainer_util", 0.01)))
    return (
        sim,
        [exp("trainer_idle", start, 300, role="trainer", node="n0")],
        "trainer hangs in TRAIN",
    )


def rollout_down(v: int):
    start = 50 + 8 * v
    role, rank, node = ("rollout", v % 2, "n1" if v % 2 == 0 else "n2")
    sim = Sim(seed=600 + v, duration=start + 60 + 40)
    sim.dead[(role, rank)] = T0 + start
    return (
        sim,
        [exp("rollout_down", start, 60, role=role, rank=rank, node=node)],
        "rollout process dies",
    )


def heartbeat_lost(v: int):
    start = 45 + 8 * v
    rank = v % 2
    sim = Sim(seed=700 + v, duration=start + 75 + 30)
    sim.dead[("trainer", rank)] = T0 + start
    return (
        sim,
        [exp("heartbeat_lost", start, 75, role="trainer", rank=rank, node="n0")],
        "trainer process dies, node alive",
    )


def node_silent(v: int):
    start = 40 + 10 * v
    node = ("n1", "n2")[v % 2]
    sim = Sim(seed=800 + v, duration=start + 75 + 30)
    sim.silent_nodes[node] = (T0 + start, T0 + 10_000)
    return sim, [exp("node_silent", start, 75, job=None, node=node)], f"{node} goes silent"


def nodes_lost(v: int):
    start = 40 + 5 * v
    sim = Sim(seed=900 + v, duration=start + 75 + 40)
    sim.silent_nodes["n1"] = (T0 + start, T0 + 10_000)
    sim.silent_nodes["n2"] = (T0 + start + (0 if v == 0 else 1), T0 + 10_000)
    expect = [exp("nodes_lost", start, 75, tier="heavy")]
    if v:
        # n1 is confirmed one tick before n2: its own medium incident is a true detection.
        expect.append(exp("node_silent", start, 75, job=None, node="n1"))
    return sim, expect, "two rollout nodes go silent"


def env_drift(v: int):
    sim = Sim(seed=1000 + v, duration=30)
    sim.fingerprints["n2"] = dict(
        FINGERPRINT, torch="2.3.0" if v == 0 else "2.4.1", cuda="12.4" if v == 0 else "12.1"
    )
    return sim, [exp("env_drift", 0, 2)], "n2 runs another torch/CUDA"


def first_step(v: int):
    start = 30 + 5 * v
    sim = Sim(seed=1100 + v, duration=start + 40)
    sim.step = 1
    sim.hooks.append(
        at(
            start,
            10_000,
            lambda s: (
                s.part_override.__setitem__((0, "trainer", "train_step_failures_total"), 1),
                s.part_override.__setitem__((0, "trainer", "train_last_failed_step"), 1),
            ),
        )
    )
    return (
        sim,
        [exp("step_failed", start, 0, tier="heavy", role="trainer", rank=0, node="n0")],
        "OOM in the job's first step",
    )


def same_step_twice(v: int):
    start = 40 + 5 * v
    sim = Sim(seed=1200 + v, duration=start + 70)

    def fail(n: int) -> Callable[[Sim], None]:
        def f(s: Sim) -> None:
            s.part_override[(0, "trainer", "train_step_failures_total")] = n
            s.part_override[(0, "trainer", "train_last_failed_step")] = 20

        return f

    sim.hooks.append(at(start, start + 30, fail(1)))
    sim.hooks.append(at(start + 30, 10_000, fail(2)))
    return (
        sim,
        [
            exp("step_failed", start, 0, role="trainer", rank=0, node="n0"),
            exp(
                "step_failed",
                start + 30,
                0,
                tier="heavy",
                decision="escalate",
                role="trainer",
                rank=0,
                node="n0",
            ),
        ],
        "step 20 fails, is retried and fails again",
    )


def stepping(
    every: float, *, frozen: Callable[[float], bool] = lambda rel: False, first: float | None = None
) -> Callable[[float, Sim], None]:
    """A hook that advances the job's step every ``every`` s of trace time, except while
    ``frozen(seconds since T0)``; the first step takes ``first`` s when given."""
    base: list[int] = []
    progress = [0.0]

    def hook(t: float, sim: Sim) -> None:
        if not base:
            base.append(sim.step)
        if not frozen(t - T0):
            progress[0] += 1
        done = progress[0]
        if first is not None:
            done = 0 if done < first else every * (1 + (done - first) // every)
        sim.step = base[0] + int(done // every)

    return hook


def _trainers(phase: str) -> Callable[[Sim], None]:
    def set_phase(s: Sim) -> None:
        s.phase[("trainer", 0)] = s.phase[("trainer", 1)] = phase

    return set_phase


def train_hang(v: int):
    start, every = 60 + 10 * v, 3 + v
    sim = Sim(seed=1300 + v, duration=start + 120 + 20)
    phase = ("TRAIN", "ROLLOUT")[v % 2]
    _trainers(phase)(sim)
    sim.hooks.append(stepping(every, frozen=lambda rel: rel >= start))
    # A hung collective spins the GPUs: utilisation stays high, only the step tells.
    sim.hooks.append(at(start, 10_000, lambda s: setattr(s, "trainer_util", 1.0)))
    return (
        sim,
        [exp("train_hang", start, 120, role="trainer", rank=r, node="n0") for r in (0, 1)],
        (f"trainers hang in a collective in {phase} ({every} s steps), GPUs at 100 %"),
    )


POSITIVE: dict[str, tuple[Scenario, int]] = {
    "pending_ratio": (golden("rollout_pending_ratio", "rollout_pending_high", 0.55, 30, 20), 3),
    "shard_rebuilds": (golden("actor_shard_rebuild_count_5m", "shard_rebuild_storm", 2, 0, 30), 3),
    "state_log_latency": (golden("state_log_write_latency_ms", "state_log_slow", 450, 10, 20), 3),
    "storage_unwritable": (
        counter_event(
            "state_log_write_errors_total", "storage_unwritable", "trainer", 0, tier="heavy"
        ),
        2,
    ),
    "step_failed": (
        counter_event("train_step_failures_total", "step_failed", "trainer", 1, step_label=True),
        2,
    ),
    "batch_timeout": (
        counter_event("rollout_batch_timeouts_total", "rollout_batch_timeout", "rollout", 0),
        2,
    ),
    "shard_stale": (counter_event("actor_shard_stale", "shard_stale", "trainer", 1), 2),
    "gpu_xid": (gpu_event("gpu_xid_critical_events_total", "gpu_xid", 1, 0, "n1", "0", xid=79), 2),
    "gpu_ecc": (
        gpu_event("gpu_ecc_uncorrected_errors_total", "gpu_ecc_uncorrectable", 2, 0, "n0", "1"),
        2,
    ),
    "gpu_remap": (
        gpu_event("gpu_remapped_rows_failure", "gpu_row_remap_failure", 1, 0, "n2", "0"),
        2,
    ),
    "gpu_throttle": (
        gpu_event("gpu_throttle_thermal_active", "gpu_throttled", 1, 60, "n1", "1", until=90),
        2,
    ),
    "gpu_lost": (gpu_lost, 2),
    "trainer_idle": (trainer_idle, 2),
    "rollout_down": (rollout_down, 2),
    "heartbeat_lost": (heartbeat_lost, 2),
    "node_silent": (node_silent, 2),
    "nodes_lost": (nodes_lost, 2),
    "env_drift": (env_drift, 2),
    "first_step": (first_step, 2),
    "same_step_twice": (same_step_twice, 2),
    "train_hang": (train_hang, 2),
}


# -- must-not-fire ----------------------------------------------------------------------------


def healthy(v: int):
    return Sim(seed=2000 + v, duration=200), [], "healthy cluster"


def tool_wait(v: int):
    sim = Sim(seed=2100 + v, duration=220)
    sim.hooks.append(
        at(
            40,
            40 + 130,
            lambda s: s.part_override.__setitem__(
                (v % 2, "rollout", "rollout_tokens_per_second"), 0
            ),
            lambda s: s.part_override.pop((v % 2, "rollout", "rollout_tokens_per_second"), None),
        )
    )
    return sim, [], "rollout waits 130 s on a tool: zero tokens, heartbeat alive"


def weight_sync_idle(v: int):
    sim = Sim(seed=2200 + v, duration=420)

    def sync(s: Sim) -> None:
        s.trainer_util = 0.0
        s.phase[("trainer", 0)] = s.phase[("trainer", 1)] = "WEIGHT_SYNC"

    def back(s: Sim) -> None:
        s.trainer_util = None
        s.phase[("trainer", 0)] = s.phase[("trainer", 1)] = "TRAIN"

    sim.hooks.append(at(30, 30 + 340, sync, back))
    return sim, [], "trainer idle 340 s during weight sync"


def short_train_idle(v: int):
    sim = Sim(seed=2300 + v, duration=330)
    sim.hooks.append(
        at(
            20,
            20 + 270,
            lambda s: setattr(s, "trainer_util", 0.0),
            lambda s: setattr(s, "trainer_util", None),
        )
    )
    return sim, [], "trainer idle 270 s in TRAIN (under the 300 s timeout)"


def idle_across_phases(v: int):
    sim = Sim(seed=2400 + v, duration=400)
    sim.trainer_util = 0.0

    def rollout_phase(s: Sim) -> None:
        s.phase[("trainer", 0)] = s.phase[("trainer", 1)] = "ROLLOUT"

    def train_phase(s: Sim) -> None:
        s.phase[("trainer", 0)] = s.phase[("trainer", 1)] = "TRAIN"

    sim.hooks.append(at(0, 180, rollout_phase, train_phase))
    sim.hooks.append(at(180 + 250, 10_000, lambda s: setattr(s, "trainer_util", None)))
    sim.duration = 180 + 250 + 10
    return sim, [], "idle 180 s in ROLLOUT then 250 s in TRAIN: only TRAIN time counts"


def node_gap(v: int):
    sim = Sim(seed=2500 + v, duration=160)
    node = ("n1", "n2")[v % 2]
    sim.silent_nodes[node] = (T0 + 60, T0 + 80)
    return sim, [], f"{node} misses 20 s of heartbeats and comes back"


def heartbeat_gap(v: int):
    sim = Sim(seed=2600 + v, duration=160)
    sim.hb_frozen[("trainer", v % 2)] = (T0 + 60, T0 + 80)
    sim.hb_frozen[("rollout", v % 2)] = (T0 + 60, T0 + 80)
    return sim, [], "participants' heartbeats stall 20 s and resume"


def brief_spikes(v: int):
    sim = Sim(seed=2700 + v, duration=200)
    sim.hooks.append(
        at(
            40,
            46,
            lambda s: s.part_override.__setitem__(
                (0, "trainer", "state_log_write_latency_ms"), 600
            ),
            lambda s: s.part_override.pop((0, "trainer", "state_log_write_latency_ms"), None),
        )
    )
    sim.hooks.append(
        at(
            70,
            90,
            lambda s: s.part_override.__setitem__((0, "rollout", "rollout_pending_ratio"), 0.7),
            lambda s: s.part_override.pop((0, "rollout", "rollout_pending_ratio"), None),
        )
    )
    sim.hooks.append(
        at(
            100,
            135,
            lambda s: s.gpu_override.__setitem__(("n1", "0", "gpu_throttle_thermal_active"), 1),
            lambda s: s.gpu_override.pop(("n1", "0", "gpu_throttle_thermal_active"), None),
        )
    )
    sim.hooks.append(
        at(
            140,
            141,
            lambda s: s.part_override.__setitem__(
                (1, "trainer", "actor_shard_rebuild_count_5m"), 1
            ),
            lambda s: s.part_override.pop((1, "trainer", "actor_shard_rebuild_count_5m"), None),
        )
    )
    return sim, [], "spikes shorter than their breach durations"


def preexisting_counters(v: int):
    sim = Sim(seed=2800 + v, duration=120)
    sim.gpu_override[("n0", "0", "gpu_ecc_uncorrected_errors_total")] = 5
    sim.gpu_override[("n1", "1", "gpu_xid_critical_events_total")] = 2
    sim.part_override[(0, "trainer", "train_step_failures_total")] = 3
    return sim, [], "counters already non-zero when the agent starts reporting"


def _paused(
    phase: str, start: float, length: float, seed: int, every: float, what: str, idle: bool
):
    def make(v: int):
        sim = Sim(seed=seed + v, duration=start + length + 60)
        sim.hooks.append(stepping(every, frozen=lambda rel: start <= rel < start + length))
        sim.hooks.append(at(start, start + length, _trainers(phase), _trainers("TRAIN")))
        if idle:
            sim.hooks.append(
                at(
                    start,
                    start + length,
                    lambda s: setattr(s, "trainer_util", 0.0),
                    lambda s: setattr(s, "trainer_util", None),
                )
            )
        return sim, [], what

    return make


def long_first_step(v: int):
    sim = Sim(seed=3300 + v, duration=400 + 60)
    sim.step = 0
    sim.hooks.append(stepping(3, first=400))
    return sim, [], "the first step takes 400 s (compilation, warm-up), then 3 s steps"


def long_tail_step(v: int):
    sim = Sim(seed=3400 + v, duration=100 + 125 + 60)
    sim.hooks.append(stepping(15, frozen=lambda rel: 100 <= rel < 225))
    return (
        sim,
        [],
        (
            "15 s steps, one of 140 s in TRAIN (a long completion): over the 120 s "
            "minimum, under 10 x the median"
        ),
    )


NEGATIVE: dict[str, tuple[Scenario, int]] = {
    "healthy": (healthy, 2),
    "tool_wait": (tool_wait, 2),
    "weight_sync_idle": (weight_sync_idle, 1),
    "short_train_idle": (short_train_idle, 1),
    "idle_across_phases": (idle_across_phases, 1),
    "node_gap": (node_gap, 2),
    "heartbeat_gap": (heartbeat_gap, 2),
    "brief_spikes": (brief_spikes, 2),
    "preexisting_counters": (preexisting_counters, 1),
    "long_weight_sync": (
        _paused(
            "WEIGHT_SYNC", 40, 300, 3000, 3, "3 s steps, then a 300 s weight sync (GPUs idle)", True
        ),
        1,
    ),
    "slow_eval": (
        _paused("EVAL", 40, 300, 3100, 3, "3 s steps, then a 300 s evaluation", False),
        1,
    ),
    "long_save": (
        _paused("SAVE", 40, 200, 3200, 3, "3 s steps, then a 200 s checkpoint save", True),
        1,
    ),
    "long_first_step": (long_first_step, 1),
    "long_tail_step": (long_tail_step, 1),
}


# -- inference engines the agent probes (--engine) ---------------------------------------------

ENGINES = {"n1": [("vllm", "rollout", 0)], "n2": [("sglang", "rollout", 1)]}


def engine_down(v: int):
    start = 50 + 6 * v
    rank, node = v % 2, ("n1", "n2")[v % 2]
    sim = Sim(seed=5100 + v, duration=start + 30 + 30)
    sim.engines = ENGINES
    sim.engine_down[("rollout", rank)] = (T0 + start, T0 + 10_000)
    return (
        sim,
        [exp("rollout_engine_down", start, 30, role="rollout", rank=rank, node=node)],
        (
            "an inference engine stops answering its health probe; its node and the rollout's heartbeat go on"
        ),
    )


def engine_tool_wait(v: int):
    sim = Sim(seed=5200 + v, duration=220)
    sim.engines = ENGINES
    rank = v % 2

    def wait(s: Sim) -> None:
        s.engine_idle.add(("rollout", rank))
        s.part_override[(rank, "rollout", "rollout_tokens_per_second")] = 0

    def back(s: Sim) -> None:
        s.engine_idle.discard(("rollout", rank))
        s.part_override.pop((rank, "rollout", "rollout_tokens_per_second"), None)

    sim.hooks.append(at(40, 40 + 130, wait, back))
    return (
        sim,
        [],
        "rollout waits 130 s on a tool: its engine answers, runs nothing, generates nothing",
    )


def engine_blip(v: int):
    sim = Sim(seed=5300 + v, duration=160)
    sim.engines = ENGINES
    sim.engine_down[("rollout", 0)] = (T0 + 60, T0 + 80)
    return sim, [], "an engine misses its health probe for 20 s (a weight load) and answers again"


# -- the scheduler's view of a node (agent --slurm-node) -----------------------------------------


def node_unavailable(v: int):
    start = 45 + 5 * v
    node = ("n1", "n2")[v % 2]
    sim = Sim(seed=5400 + v, duration=start + 40)
    sim.slurm = True
    sim.slurm_unavailable[node] = (T0 + start, T0 + 10_000)
    return (
        sim,
        [exp("node_unavailable", start, 0, job=None, node=node)],
        (f"Slurm drains {node} (its agent and processes go on reporting)"),
    )


def slurm_healthy(v: int):
    sim = Sim(seed=5500 + v, duration=120)
    sim.slurm = True
    return sim, [], "every node IDLE/ALLOCATED in Slurm"


POSITIVE["engine_down"] = (engine_down, 2)
POSITIVE["node_unavailable"] = (node_unavailable, 2)
NEGATIVE["slurm_healthy"] = (slurm_healthy, 1)
NEGATIVE["engine_tool_wait"] = (engine_tool_wait, 2)
NEGATIVE["engine_blip"] = (engine_blip, 1)


# -- start-up grace (detection.startup) ----------------------------------------------------------


def slow_start(v: int):
    """A rollout engine that takes minutes to start: STARTING for 180 s (the launcher wrote the
    phase once), then loading and compiling with no heartbeat of its own until 240 s: all well
    within the rollout's start-up grace (600 s)."""
    role, rank = "rollout", v % 2
    sim = Sim(seed=5600 + v, duration=320)
    sim.phase[(role, rank)] = "STARTING"
    sim.hb_frozen[(role, rank)] = (T0, T0 + 240)
    sim.hooks.append(at(180, 10_000, lambda s: s.phase.__setitem__((role, rank), "ROLLOUT")))
    return (
        sim,
        [],
        f"{role}-{rank} starts slowly (STARTING 180 s, silent until 240 s) within its grace",
    )


def flapping(v: int):
    """A rollout that keeps crashing and being restarted by its launcher: every 25 s it exits
    (EXITED, stale heartbeat, 5 s), is STARTING again (10 s, the launcher keeps its heartbeat),
    and runs 10 s. The first exit is the fault; each restart's grace must not hide the next."""
    role, rank = "rollout", v % 2
    node = ("n1", "n2")[rank]
    start = 40 + 6 * v

    def cycle(t: float, sim: Sim) -> None:
        rel = t - T0 - start
        if rel < 0:
            return
        k, pos = divmod(rel, 25)
        exit_at = T0 + start + 25 * k
        if pos < 5:
            sim.phase[(role, rank)] = "EXITED"
            sim.hb_frozen[(role, rank)] = (exit_at, exit_at + 5)
            return
        sim.hb_frozen.pop((role, rank), None)
        if pos < 15:
            sim.phase[(role, rank)] = "STARTING"
            sim.part_override[(rank, role, "rollout_tokens_per_second")] = 0
        else:
            sim.phase[(role, rank)] = "ROLLOUT"
            sim.part_override.pop((rank, role, "rollout_tokens_per_second"), None)

    sim = Sim(seed=5700 + v, duration=start + 160)
    sim.hooks.append(cycle)
    return (
        sim,
        [exp("heartbeat_lost", start, 0, role=role, rank=rank, node=node)],
        (f"{role}-{rank} crashes and is restarted every 25 s"),
    )


POSITIVE["flapping"] = (flapping, 2)
NEGATIVE["slow_start"] = (slow_start, 2)


# -- clock skew: nodes whose clock is off (stamps corrected by the server, clock_skew said) ----

SKEWS = (25.0, 30.0, -20.0)  # seconds behind the server (negative: ahead)


def _skew_seen(behind: float) -> float:
    """When the server's estimate holds (s into the trace): a node ahead at its first batch, a
    node behind at its third (three batches must agree)."""
    return 0.25 if behind < 0 else 2.25


def clock_off_healthy(v: int):
    """A healthy node whose clock is off: without the correction its samples look too old to
    judge and its heartbeats silent (false rollout_down / heartbeat_lost); with it, only the
    light clock_skew, once the offset has lasted sustain_seconds (60 s)."""
    behind = SKEWS[v]
    sim = Sim(seed=5800 + v, duration=240)
    sim.clock_behind["n1"] = behind
    return (
        sim,
        [exp("clock_skew", _skew_seen(behind), 60, tier="light", job=None, node="n1")],
        (f"n1's clock {abs(behind):.0f} s {'behind' if behind > 0 else 'ahead'}, healthy"),
    )


def clock_off_rollout_dies(v: int):
    """A node whose clock is off and whose rollout dies: the death is still seen in time."""
    behind = SKEWS[v]
    start = 120 + 5 * v
    sim = Sim(seed=5900 + v, duration=start + 60 + 40)
    sim.clock_behind["n1"] = behind
    sim.dead[("rollout", 0)] = T0 + start
    return (
        sim,
        [
            exp("clock_skew", _skew_seen(behind), 60, tier="light", job=None, node="n1"),
            exp("rollout_down", start, 60, role="rollout", rank=0, node="n1"),
        ],
        f"n1's clock {behind:.0f} s off; its rollout dies",
    )


def clock_ntp_jitter(v: int):
    """A clock a second off (NTP catching up): nothing to correct, nothing to say."""
    sim = Sim(seed=6000 + v, duration=240)
    sim.clock_behind["n2"] = (1.0, -1.5)[v]
    return sim, [], "n2's clock a second off"


POSITIVE["clock_off_healthy"] = (clock_off_healthy, 3)
POSITIVE["clock_off_rollout_dies"] = (clock_off_rollout_dies, 3)
NEGATIVE["clock_ntp_jitter"] = (clock_ntp_jitter, 2)


# -- correlated GPU faults (issue 21): a node's GPUs failing together are one node incident --

EIGHT = tuple(str(g) for g in range(8))


def xid_on(node: str, gpu: str, code: int) -> Callable[[Sim], None]:
    """What the agent reports for one XID event: its per-code counter, the critical counter and
    newest code when the code is in the agent's critical set, and for 79 the GPU lost in the
    same round (the agent drains a GPU's events before it finds the GPU gone)."""

    def fire(sim: Sim) -> None:
        counts = sim.xid_events.setdefault((node, gpu), {})
        counts[code] = counts.get(code, 0) + 1
        if code in CRITICAL_XIDS:
            key = (node, gpu, "gpu_xid_critical_events_total")
            sim.gpu_override[key] = sim.gpu_override.get(key, 0) + 1
            sim.gpu_override[(node, gpu, "gpu_xid_last_code")] = code
        if code == 79:
            sim.hooks.append(at(0, 10_000, lambda s: s.gpu_missing.add((node, gpu))))

    return fire


def once(start: float, fn: Callable[[Sim], None]) -> Callable[[float, Sim], None]:
    def hook(t: float, sim: Sim) -> None:
        if T0 + start <= t < T0 + start + 1:
            fn(sim)

    return hook


def baseboard(v: int):
    """XID 79 on all eight GPUs of a node at once (its baseboard): one node_gpus_failed."""
    node = ("n1", "n0")[v % 2]
    start = 50 + 5 * v
    sim = Sim(seed=5800 + v, duration=start + 60)
    sim.node_gpus[node] = EIGHT
    for g in EIGHT:
        sim.hooks.append(once(start, xid_on(node, g, 79)))
    return (
        sim,
        [exp("node_gpus_failed", start, 0, tier="heavy", job=None, node=node)],
        (f"XID 79 on all 8 GPUs of {node} (a baseboard)"),
    )


def node_of_four(v: int):
    """A node that reports four GPUs loses all four (XID 95, uncontained ECC: RESET_GPU) within
    a few seconds: "every GPU the node reports", one node_gpus_failed."""
    start = 45 + 6 * v
    sim = Sim(seed=5900 + v, duration=start + 60)
    sim.node_gpus["n2"] = EIGHT[:4]
    for i, g in enumerate(EIGHT[:4]):
        sim.hooks.append(once(start + i % 2, xid_on("n2", g, 95)))
    return (
        sim,
        [exp("node_gpus_failed", start, 1, tier="heavy", job=None, node="n2")],
        ("XID 95 on all 4 GPUs of n2 within 2 s"),
    )


def gpus_partial(v: int):
    """Half of an eight-GPU node fails together (XID 79 on four GPUs): below min_gpus (every
    GPU the node reports), so four per-GPU incidents, not a node-level one, once the burst has
    waited settle_seconds for the rest of the node."""
    start = 55 + 4 * v
    gpus = EIGHT[v % 2 :: 2]
    sim = Sim(seed=6000 + v, duration=start + 60)
    sim.node_gpus["n1"] = EIGHT
    for g in gpus:
        sim.hooks.append(once(start, xid_on("n1", g, 79)))
    # window 5: a burst below min_gpus waits detection.gpu.correlated.settle_seconds (5 s) for
    # the rest of the node before its GPUs open incidents of their own
    expect = [exp("gpu_xid", start, 5, job=None, node="n1", gpu=g) for g in gpus]
    return sim, expect, f"XID 79 on GPUs {', '.join(gpus)} of n1 (4 of 8)"


def gpus_unrelated(v: int):
    """The must-not-fold twin: every GPU of an eight-GPU node has one fault of its own, 90 s
    apart (1.5 windows; hours apart on a real cluster, compressed to keep the corpus small, and
    closer than the XIDs' 120 s hold, so that several GPUs' signals are up at once and only the
    window keeps them apart): eight per-GPU incidents (light or medium by the XID's bucket), no
    node-level one, although every GPU fails once and one of them (the 79) stays lost."""
    codes = [13, 31, 48, 79, 94, 64, 119, 74]
    if v % 2:
        codes.reverse()
    sim = Sim(seed=6100 + v, duration=40 + 90 * 7 + 60)
    sim.node_gpus["n1"] = EIGHT
    expect = []
    for i, (g, code) in enumerate(zip(EIGHT, codes, strict=True)):
        start = 40 + 90 * i
        sim.hooks.append(once(start, xid_on("n1", g, code)))
        expect.append(exp("gpu_xid", start, 0, job=None, node="n1", gpu=g))
    return sim, expect, "one XID of its own on each of the 8 GPUs of n1, 90 s apart"


POSITIVE["baseboard"] = (baseboard, 2)
POSITIVE["node_of_four"] = (node_of_four, 2)
POSITIVE["gpus_partial"] = (gpus_partial, 2)
POSITIVE["gpus_unrelated"] = (gpus_unrelated, 2)


# -- flapping and noise: a signal around its threshold opens one incident, short gaps none ----


def _cycle(start: float, on: float, off: float, fn: Callable[[Sim, bool], None]):
    """From ``start`` (s into the trace): ``on`` s of fn(sim, True), ``off`` s of fn(sim, False)."""

    def hook(t: float, sim: Sim) -> None:
        rel = t - T0 - start
        if rel >= 0:
            fn(sim, rel % (on + off) < on)

    return hook


def _pending_ratio(rank: int, high: float, low: float) -> Callable[[Sim, bool], None]:
    def set_(s: Sim, up: bool) -> None:
        s.part_override[(rank, "rollout", "rollout_pending_ratio")] = high if up else low

    return set_


def pending_around_warning(v: int):
    """The pending ratio swings across its warning (0.3) every 10 s, never down to healthy
    (0.1): one breach, one incident, held open while it swings (the band between healthy and
    warning is the hysteresis)."""
    start = 40 + 5 * v
    sim = Sim(seed=6100 + v, duration=start + 300)
    sim.hooks.append(_cycle(start, 10, 10, _pending_ratio(0, 0.36, 0.24)))
    return (
        sim,
        [exp("rollout_pending_high", start, 30, role="rollout", rank=0, node="n1")],
        ("rollout-0's pending ratio swings between 0.24 and 0.36 every 10 s"),
    )


def pending_on_and_off(v: int):
    """The pending ratio breaches 40 s, is healthy 20 s, breaches again, four times: the quiet
    period (30 s) holds the one incident open across the healthy spells."""
    start = 40 + 5 * v
    sim = Sim(seed=6200 + v, duration=start + 260)
    sim.hooks.append(_cycle(start, 40, 20, _pending_ratio(1, 0.6, 0.02)))
    return (
        sim,
        [exp("rollout_pending_high", start, 30, role="rollout", rank=1, node="n2")],
        ("rollout-1's pending ratio high 40 s, healthy 20 s, four times"),
    )


def heartbeat_gaps_repeated(v: int):
    """A trainer whose heartbeat stalls 10 s every 25 s (a slow filesystem), always under the
    15 s suspicion threshold: nothing opens, however often."""
    rank = v % 2

    def stall(t: float, sim: Sim) -> None:
        rel = t - T0 - 40
        if rel < 0:
            return
        k, pos = divmod(rel, 25)
        began = T0 + 40 + 25 * k
        if pos < 10:
            sim.hb_frozen[("trainer", rank)] = (began, began + 10)
        else:
            sim.hb_frozen.pop(("trainer", rank), None)

    sim = Sim(seed=6300 + v, duration=340)
    sim.hooks.append(stall)
    return sim, [], f"trainer-{rank}'s heartbeat stalls 10 s every 25 s"


POSITIVE["pending_around_warning"] = (pending_around_warning, 2)
POSITIVE["pending_on_and_off"] = (pending_on_and_off, 2)
NEGATIVE["heartbeat_gaps_repeated"] = (heartbeat_gaps_repeated, 2)


# -- stragglers (detection.straggler) ------------------------------------------------------------

# Five rollouts on five nodes (4 peers each, over the minimum of 3), five trainer ranks on n0.
STRAGGLER_LAYOUT = {
    "n0": [("trainer", r) for r in range(5)],
    **{f"n{r + 1}": [("rollout", r)] for r in range(5)},
}
STRAGGLER_SUSTAIN = 120  # detection.straggler.sustain_seconds


def _step_seconds(slow: dict[int, float]) -> Callable[..., None]:
    """Trainers report their own step time (train_step_seconds): 3 s ± 10 %, or ``slow[rank]``
    while set; drawn from the participant's own RNG so the cluster's stays as it was."""
    rng = random.Random(17)

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[[str, float], None]) -> None:
        if role == "trainer":
            add("train_step_seconds", slow.get(rank, 3.0) * rng.uniform(0.9, 1.1))

    return sample


def straggler_rollout(v: int):
    start, rank = 40 + 7 * v, (2, 4)[v % 2]
    sim = Sim(seed=6000 + v, duration=start + STRAGGLER_SUSTAIN + 20, layout=STRAGGLER_LAYOUT)
    sim.hooks.append(
        at(
            start,
            10_000,
            lambda s: s.part_override.__setitem__(
                (rank, "rollout", "rollout_tokens_per_second"), 300
            ),
        )
    )
    return (
        sim,
        [
            exp(
                "straggler",
                start,
                STRAGGLER_SUSTAIN,
                role="rollout",
                rank=rank,
                node=f"n{rank + 1}",
            )
        ],
        (
            f"rollout-{rank} generates 300 tokens/s, its 4 peers 800-1500 (a slow GPU or a throttled link)"
        ),
    )


def straggler_trainer(v: int):
    start, rank = 50 + 5 * v, 3
    slow: dict[int, float] = {}
    sim = Sim(seed=6100 + v, duration=start + STRAGGLER_SUSTAIN + 20, layout=STRAGGLER_LAYOUT)
    sim.part_samples.append(_step_seconds(slow))
    sim.hooks.append(at(start, 10_000, lambda s: slow.__setitem__(rank, 9.0)))
    return (
        sim,
        [exp("straggler", start, STRAGGLER_SUSTAIN, role="trainer", rank=rank, node="n0")],
        (f"trainer-{rank} reports 9 s steps, its 4 peers 3 s"),
    )


def uniform_slow_fleet(v: int):
    sim = Sim(seed=6200 + v, duration=300, layout=STRAGGLER_LAYOUT)
    sim.part_samples.append(_step_seconds({r: 12.0 for r in range(5)}))
    for rank in range(5):  # every rollout slow alike: a smaller GPU, a longer prompt mix
        sim.part_override[(rank, "rollout", "rollout_tokens_per_second")] = 250 + 10 * rank
    return (
        sim,
        [],
        "every rollout at 250-290 tokens/s and every trainer at 12 s steps: slow, but uniform",
    )


def straggler_few_peers(v: int):
    sim = Sim(seed=6300 + v, duration=300)  # the corpus's usual cluster: 2 rollouts, 2 trainers
    sim.part_samples.append(_step_seconds({1: 9.0}))
    sim.part_override[(v % 2, "rollout", "rollout_tokens_per_second")] = 200
    return (
        sim,
        [],
        "one rollout at 200 tokens/s and one trainer at 9 s steps, with a single peer each",
    )


def straggler_short_dip(v: int):
    sim = Sim(seed=6400 + v, duration=320, layout=STRAGGLER_LAYOUT)
    slow: dict[int, float] = {}
    sim.part_samples.append(_step_seconds(slow))
    key = (1, "rollout", "rollout_tokens_per_second")
    sim.hooks.append(
        at(
            40,
            40 + 90,
            lambda s: s.part_override.__setitem__(key, 250),
            lambda s: s.part_override.pop(key, None),
        )
    )
    sim.hooks.append(
        at(150, 150 + 100, lambda s: slow.__setitem__(4, 9.0), lambda s: slow.pop(4, None))
    )
    return (
        sim,
        [],
        "rollout-1 slow for 90 s, trainer-4 slow for 100 s: under the 120 s sustain time",
    )


POSITIVE["straggler_rollout"] = (straggler_rollout, 2)
POSITIVE["straggler_trainer"] = (straggler_trainer, 1)
NEGATIVE["uniform_slow_fleet"] = (uniform_slow_fleet, 1)
NEGATIVE["straggler_few_peers"] = (straggler_few_peers, 1)
NEGATIVE["straggler_short_dip"] = (straggler_short_dip, 1)


# -- an engine dead inside a live worker (EngineStalledDetector) ----------------------------------

ENGINE_STALL = 60  # detection.rollout.stall_timeout_seconds


def _pending(counts: dict[int, Callable[[float], float]]) -> Callable[..., None]:
    """Rollouts report their pending rollouts (heartbeat ``rollouts_pending``): 0-2 normally,
    ``counts[rank](t)`` while set."""
    rng = random.Random(23)

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[[str, float], None]) -> None:
        if role == "rollout":
            f = counts.get(rank)
            add("rollout_pending_count", f(t) if f is not None else rng.randint(0, 2))

    return sample


def engine_dead_in_worker(v: int):
    """The engine of a rollout dies; the worker around it keeps its heartbeat and keeps taking
    work: no tokens, and its queue grows (v 0), or stays full while its step is frozen (v 1)."""
    start, rank = 50 + 6 * v, v % 2
    node = ("n1", "n2")[rank]
    counts: dict[int, Callable[[float], float]] = {}
    sim = Sim(seed=6500 + v, duration=start + ENGINE_STALL + 30)
    sim.part_samples.append(_pending(counts))

    def dead(s: Sim) -> None:
        s.part_override[(rank, "rollout", "rollout_tokens_per_second")] = 0
        counts[rank] = (lambda t: 3 + (t - T0 - start) // 4) if v == 0 else (lambda t: 6)

    sim.hooks.append(at(start, 10_000, dead))
    how = "its pending rollouts grow" if v == 0 else "6 rollouts stay pending, its step frozen"
    return (
        sim,
        [exp("rollout_engine_down", start, ENGINE_STALL, role="rollout", rank=rank, node=node)],
        (f"rollout-{rank}'s engine dies inside its live worker: no tokens, heartbeat alive, {how}"),
    )


def tool_wait_nothing_piling(v: int):
    sim = Sim(seed=6600 + v, duration=260)
    rank = v % 2
    counts: dict[int, Callable[[float], float]] = {}
    sim.part_samples.append(_pending(counts))
    key = (rank, "rollout", "rollout_tokens_per_second")

    def wait(s: Sim) -> None:
        s.part_override[key] = 0
        counts[rank] = lambda t: 0

    def back(s: Sim) -> None:
        s.part_override.pop(key, None)
        counts.pop(rank, None)

    sim.hooks.append(at(40, 40 + 170, wait, back))
    return (
        sim,
        [],
        "rollout waits 170 s on a tool: no tokens, heartbeat alive, nothing pending at its engine",
    )


def busy_queue(v: int):
    sim = Sim(seed=6700 + v, duration=200)
    counts: dict[int, Callable[[float], float]] = {0: lambda t: 2 + (t - T0) // 10}
    sim.part_samples.append(_pending(counts))
    return sim, [], "rollout-0's queue grows while it generates: busy, not dead"


POSITIVE["engine_dead_in_worker"] = (engine_dead_in_worker, 2)
NEGATIVE["tool_wait_nothing_piling"] = (tool_wait_nothing_piling, 2)
NEGATIVE["busy_queue"] = (busy_queue, 1)


# -- a trainer slow by its pace (no step time of its own) --------------------------------------

PACE_STEPS = 5  # detection.straggler.pace_steps


def _own_pace(every: dict[int, float]) -> Callable[[float, Sim], None]:
    """Trainers that step independently: rank r finishes a step every ``every[r]`` s (3 s when
    unset), each from its own start, so the ranks' steps drift apart as in the real thing."""
    done: dict[int, float] = {}

    def hook(t: float, sim: Sim) -> None:
        for role, rank in sim.layout["n0"]:
            done[rank] = done.get(rank, 0.0) + 1.0 / every.get(rank, 3.0)
            sim.rank_step[(role, rank)] = 20 + int(done[rank])

    return hook


def straggler_trainer_pace(v: int):
    """A trainer rank that reports no step time of its own (ranks that step independently)
    slows from 3 s to 9 s steps: its pace, the median of its last five step times, turns once
    the step in progress and two more have taken their slow time (at most 27 s + 9 s), and the
    straggler holds the sustain time from then."""
    start, rank = 45 + 7 * v, (3, 1)[v % 2]
    every: dict[int, float] = {}
    sim = Sim(seed=6700 + v, duration=start + 36 + STRAGGLER_SUSTAIN + 30, layout=STRAGGLER_LAYOUT)
    sim.hooks.append(_own_pace(every))
    sim.hooks.append(at(start, 10_000, lambda s: every.__setitem__(rank, 9.0)))
    window = (PACE_STEPS // 2 + 2) * 9 + STRAGGLER_SUSTAIN
    return (
        sim,
        [exp("straggler", start, window, role="trainer", rank=rank, node="n0")],
        (
            f"trainer-{rank} steps every 9 s, its 4 peers every 3 s (no train_step_seconds: judged by pace)"
        ),
    )


def uniform_slow_pace(v: int):
    sim = Sim(seed=6800 + v, duration=360, layout=STRAGGLER_LAYOUT)
    sim.hooks.append(_own_pace({r: 8.0 + 0.5 * r for r in range(5)}))
    return sim, [], "every trainer steps every 8-10 s by its own pace: slow, but uniform"


POSITIVE["straggler_trainer_pace"] = (straggler_trainer_pace, 2)
NEGATIVE["uniform_slow_pace"] = (uniform_slow_pace, 1)


# -- a node back from an outage (its first batches carry stale heartbeats) -----------------------


def node_back_stale_heartbeat(v: int):
    """A node hangs as a whole (a kernel stall, a paused VM): its agent and its processes stop
    together for 120 s. Back, its agent's first batches still carry the heartbeats written before
    the stall, until the processes write again a few seconds later. Only the node's silence is a
    fault; the stale heartbeats in its first batches are not participants lost."""
    node = ("n1", "n0", "n2")[v]
    start, back = 40 + 5 * v, 160 + 5 * v
    sim = Sim(seed=6900 + v, duration=back + 120)
    sim.silent_nodes[node] = (T0 + start, T0 + back)
    for role, rank in sim.layout[node]:
        sim.hb_frozen[(role, rank)] = (T0 + start, T0 + back + 3 + v)
    return (
        sim,
        [exp("node_silent", start, 75, job=None, node=node)],
        (f"{node} stalls 120 s with its processes; back, its heartbeats stay stale {3 + v} s more"),
    )


def node_back_process_dead(v: int):
    """The same outage, but trainer-{v} died during it: back, its heartbeat stays stale and it is
    lost once it has been silent for the usual suspect + confirm time counted from the node's
    return (the earlier silence was the node's, already an incident of its own)."""
    start, back = 40 + 5 * v, 160 + 5 * v
    sim = Sim(seed=7000 + v, duration=back + 75 + 30)
    sim.silent_nodes["n0"] = (T0 + start, T0 + back)
    sim.hb_frozen[("trainer", 1 - v)] = (T0 + start, T0 + back + 2)
    sim.dead[("trainer", v)] = T0 + start + 30
    return (
        sim,
        [
            exp("node_silent", start, 75, job=None, node="n0"),
            exp("heartbeat_lost", back, 75, role="trainer", rank=v, node="n0"),
        ],
        (f"n0 stalls 120 s; trainer-{v} died during it and stays silent after the node's return"),
    )


NEGATIVE["node_back_stale_heartbeat"] = (node_back_stale_heartbeat, 3)
POSITIVE["node_back_process_dead"] = (node_back_process_dead, 2)

# -- exit causes: a failed process's own output says why (the launcher's exit-cause catalogue) --

OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
    "total capacity of 79.15 GiB of which 1.06 GiB is free."
)
NCCL_LINE = (
    "[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=412, "
    "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600021 milliseconds"
)


def _exit(
    sim: Sim,
    role: str,
    rank: int,
    at_s: float,
    cause: tuple[str, str, str] | None,
    back_s: float | None = None,
) -> None:
    """``role``-``rank`` fails at ``at_s`` (its launcher writes EXITED, with the cause it read
    in the process's output, if any); ``back_s``: restarted then (its own heartbeats again,
    without a cause). The cause sample's value is the exit's heartbeat time, as the agent
    sends it."""
    died = T0 + at_s

    def fail(s: Sim) -> None:
        s.dead[(role, rank)] = died
        s.phase[(role, rank)] = "EXITED"

    def back(s: Sim) -> None:
        s.dead.pop((role, rank), None)
        s.phase[(role, rank)] = "TRAIN" if role == "trainer" else "ROLLOUT"

    sim.hooks.append(at(at_s, back_s if back_s is not None else 10_000, fail, back))
    if cause is None:
        return

    def sample(s: Sim, r: str, k: int, t: float, add: Callable[..., None]) -> None:
        if (r, k) == (role, rank) and s.dead.get((role, rank)) == died:
            name, kind, line = cause
            add("participant_exit_cause", died - 1.0, cause=name, kind=kind, line=line[:120])

    sim.part_samples.append(sample)


def exit_cuda_oom(v: int):
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=7100 + v, duration=start + 30)
    _exit(sim, "trainer", rank, start, ("cuda_oom", "cuda_oom", OOM_LINE))
    return (
        sim,
        [exp("cuda_oom", start, 0, role="trainer", rank=rank, node="n0")],
        (f"trainer-{rank} dies of a CUDA OOM its output names"),
    )


def exit_cuda_oom_same_step(v: int):
    """Restarted after its OOM, the trainer dies of it again at the same step: restarting into
    the same OOM fixes nothing, the second one escalates to a person."""
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=7200 + v, duration=start + 70)
    _exit(sim, "trainer", rank, start, ("cuda_oom", "cuda_oom", OOM_LINE), back_s=start + 15)
    _exit(sim, "trainer", rank, start + 30, ("cuda_oom", "cuda_oom", OOM_LINE))
    return (
        sim,
        [
            exp("cuda_oom", start, 0, role="trainer", rank=rank, node="n0"),
            exp(
                "cuda_oom",
                start + 30,
                0,
                tier="heavy",
                decision="escalate",
                role="trainer",
                rank=rank,
                node="n0",
            ),
        ],
        f"trainer-{rank} dies of a CUDA OOM at step 20, is restarted and dies of it again",
    )


def exit_collective_timeout(v: int):
    """Both trainer ranks die of the NCCL watchdog (one waited for the other): one incident
    about the role, not one per rank."""
    start = 40 + 6 * v
    sim = Sim(seed=7300 + v, duration=start + 30)
    for rank in (0, 1):
        _exit(
            sim,
            "trainer",
            rank,
            start + rank * (1 + v),
            ("collective_timeout", "collective_timeout", NCCL_LINE.format(rank=rank)),
        )
    return (
        sim,
        [exp("collective_timeout", start, 0, role="trainer")],
        ("both trainer ranks die of the NCCL watchdog's collective timeout"),
    )


def exit_disk_full(v: int):
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=7400 + v, duration=start + 30)
    line = "OSError: [Errno 28] No space left on device: '/ckpt/step_20/model.safetensors.tmp'"
    _exit(sim, "trainer", rank, start, ("disk_full", "storage_unwritable", line))
    return (
        sim,
        [exp("storage_unwritable", start, 0, tier="heavy", role="trainer", rank=rank, node="n0")],
        f"trainer-{rank} dies writing a checkpoint to a full disk",
    )


def exit_engine_fatal(v: int):
    # Short after the exit: a rollout still dead after the stall timeout is rollout_down.
    start, rank = 40 + 6 * v, v % 2
    node = ("n1", "n2")[rank]
    sim = Sim(seed=7500 + v, duration=start + 30)
    line = "ERROR [core_client.py:564] EngineCore encountered a fatal error."
    _exit(sim, "rollout", rank, start, ("engine_fatal", "rollout_engine_down", line))
    return (
        sim,
        [exp("rollout_engine_down", start, 0, role="rollout", rank=rank, node=node)],
        (f"rollout-{rank}'s vLLM engine core dies with a fatal error"),
    )


def exit_host_oom(v: int):
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=7600 + v, duration=start + 30)
    line = (
        "oom-kill: the kernel's OOM killer ended a process of this cgroup while it ran "
        "(memory.events oom_kill 0 -> 1)"
    )
    _exit(sim, "trainer", rank, start, ("host_oom_killed", "host_oom", line))
    return (
        sim,
        [exp("host_oom", start, 0, role="trainer", rank=rank, node="n0")],
        (f"trainer-{rank} is SIGKILLed by the kernel's OOM killer"),
    )


def exit_unknown_after_known(v: int):
    """Twin: trainer-{rank} died of an OOM earlier and was restarted; now it dies again with no
    cause in its output (a SIGKILL). The old cause is not this exit's: heartbeat_lost, as for
    any exit of unknown cause, and no second cuda_oom."""
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=7700 + v, duration=start + 110)
    _exit(sim, "trainer", rank, start, ("cuda_oom", "cuda_oom", OOM_LINE), back_s=start + 15)
    _exit(sim, "trainer", rank, start + 75, None)
    return (
        sim,
        [
            exp("cuda_oom", start, 0, role="trainer", rank=rank, node="n0"),
            exp("heartbeat_lost", start + 75, 0, role="trainer", rank=rank, node="n0"),
        ],
        f"trainer-{rank} dies of an OOM, is restarted, then is killed with no output",
    )


POSITIVE["exit_cuda_oom"] = (exit_cuda_oom, 2)
POSITIVE["exit_cuda_oom_same_step"] = (exit_cuda_oom_same_step, 2)
POSITIVE["exit_collective_timeout"] = (exit_collective_timeout, 2)
POSITIVE["exit_disk_full"] = (exit_disk_full, 2)
POSITIVE["exit_engine_fatal"] = (exit_engine_fatal, 2)
POSITIVE["exit_host_oom"] = (exit_host_oom, 1)
POSITIVE["exit_unknown_after_known"] = (exit_unknown_after_known, 2)


# -- inference engines seen level by level (issue 44 item 2, issue 40 item 5) --------------------
# The agent watches the engine's process tree on its node (rollout_engine_process_dead per
# level, rollout_engine_uptime_seconds) and reads its counters (tokens, finished requests by
# reason, preemptions), besides /health. What a real vLLM 0.32 does, as measured here: a level
# killed takes the API server down within a second (its port closes, /health refused); SIGSTOP
# leaves every process alive and /health unanswered; /pause keeps /health at 200 and freezes
# the request gauges at their last value and the token counter.

LIVE_LEVELS = ("api_server", "engine_core", "worker")


@dataclass
class EngineLive:
    """Per engine (role, rank): spans of the simulated faults, and its counters."""

    started: dict[tuple[str, int], float] = field(default_factory=dict)  # default: an hour ago
    answers_from: dict[tuple[str, int], float] = field(default_factory=dict)  # start-up: /health
    dead: dict[tuple[str, int], tuple[str, float]] = field(default_factory=dict)  # level, at
    frozen: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)  # SIGSTOP
    wedged: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)  # /pause
    idle: set[tuple[str, int]] = field(default_factory=set)
    # (from, to, errored per s, aborted per s, ok per s)
    failing: dict[tuple[str, int], tuple[float, float, float, float, float]] = field(
        default_factory=dict
    )
    preempting: dict[tuple[str, int], tuple[float, float, float]] = field(
        default_factory=dict
    )  # per s
    counters: dict[tuple[tuple[str, int], str], float] = field(default_factory=dict)
    gauges: dict[tuple[str, int], tuple[int, int]] = field(
        default_factory=dict
    )  # last running, waiting

    def _bump(self, who: tuple[str, int], name: str, by: float) -> float:
        key = (who, name)
        self.counters[key] = self.counters.get(key, 0.0) + by
        return self.counters[key]

    def samples(
        self,
        sim: Sim,
        who: tuple[str, int],
        t: float,
        labels: dict[str, str],
        add: Callable[..., None],
    ) -> None:
        r = sim.rng
        rel = t - T0
        dead = self.dead.get(who)
        if dead is not None and rel >= dead[1]:
            # the killed level at once; the API server follows within a second (EngineDeadError)
            gone = {dead[0]} | (
                {"api_server", "engine_core", "worker"} if rel >= dead[1] + 1 else set()
            )
            for level in LIVE_LEVELS:
                add("rollout_engine_process_dead", int(level in gone), **labels, process=level)
            add("rollout_engine_up", 0, **labels)
            return
        for level in LIVE_LEVELS:
            add("rollout_engine_process_dead", 0, **labels, process=level)
        started = self.started.get(who, -3600.0)
        add("rollout_engine_uptime_seconds", rel - started, **labels)
        frozen = self.frozen.get(who)
        if rel < self.answers_from.get(who, -1e9) or (frozen and frozen[0] <= rel < frozen[1]):
            add("rollout_engine_up", 0, **labels)  # the probe timed out or was refused
            return
        add("rollout_engine_up", 1, **labels)
        wedged = self.wedged.get(who)
        if wedged and wedged[0] <= rel < wedged[1]:
            running, waiting = self.gauges.get(who, (8, 1))  # frozen at their last value
            tokens = self._bump(who, "tokens", 0)
        else:
            if who in self.idle:
                running, waiting, rate = 0, 0, 0.0
            else:
                running, waiting, rate = r.randint(4, 24), r.randint(0, 2), r.uniform(800, 1500)
            self.gauges[who] = (running, waiting) if running else self.gauges.get(who, (8, 1))
            tokens = self._bump(who, "tokens", rate)
        ok = (
            0.0
            if who in self.idle or (wedged and wedged[0] <= rel < wedged[1])
            else r.uniform(2, 6)
        )
        errored = aborted = 0.0
        failing = self.failing.get(who)
        if failing and failing[0] <= rel < failing[1]:
            errored, aborted, ok = failing[2], failing[3], failing[4]
        preempt = self.preempting.get(who)
        preempted = preempt[2] if preempt and preempt[0] <= rel < preempt[1] else 0.0
        add("rollout_engine_requests_running", running, **labels)
        add("rollout_engine_requests_waiting", waiting, **labels)
        add(
            "rollout_engine_kv_cache_usage_ratio", r.uniform(0.2, 0.7) if running else 0.0, **labels
        )
        add("rollout_tokens_generated_total", tokens, **labels)
        add("rollout_engine_requests_errored_total", self._bump(who, "errored", errored), **labels)
        add("rollout_engine_requests_aborted_total", self._bump(who, "aborted", aborted), **labels)
        add(
            "rollout_engine_requests_finished_total",
            self._bump(who, "finished", ok + errored + aborted),
            **labels,
        )
        add("rollout_engine_preemptions_total", self._bump(who, "preempted", preempted), **labels)


LIVE_ENGINES = {"n1": [("vllm", "rollout", 0)], "n2": [("vllm", "rollout", 1)]}


def _live(seed: int, duration: float) -> tuple[Sim, EngineLive]:
    sim = Sim(seed=seed, duration=duration)
    sim.engines = LIVE_ENGINES
    sim.engine_live = EngineLive()
    return sim, sim.engine_live


def engine_process_killed(v: int):
    level = LIVE_LEVELS[v % 3]
    rank, node = v % 2, ("n1", "n2")[v % 2]
    start = 40 + 3 * v
    sim, live = _live(6100 + v, start + 40)
    live.dead[("rollout", rank)] = (level, start)
    return (
        sim,
        [exp("rollout_engine_dead", start, 0, role="rollout", rank=rank, node=node)],
        (f"kill -9 of the {level} of a vLLM engine (the API server exits a second later)"),
    )


def engine_frozen(v: int):
    rank, node = v % 2, ("n1", "n2")[v % 2]
    start = 45 + 4 * v
    sim, live = _live(6200 + v, start + 40)
    live.frozen[("rollout", rank)] = (start, 10_000)
    return (
        sim,
        [exp("rollout_engine_hung", start, 10, role="rollout", rank=rank, node=node)],
        ("SIGSTOP of a vLLM engine: every process alive, /health unanswered"),
    )


def engine_paused(v: int):
    rank, node = v % 2, ("n1", "n2")[v % 2]
    start = 50 + 5 * v
    sim, live = _live(6300 + v, start + 60)
    live.wedged[("rollout", rank)] = (start, 10_000)
    return (
        sim,
        [exp("rollout_engine_wedged", start, 30, role="rollout", rank=rank, node=node)],
        ("a wedged vLLM engine (/pause): /health 200, requests running and waiting, no token"),
    )


def engine_failing_requests(v: int):
    rank, node = v % 2, ("n1", "n2")[v % 2]
    start = 60 + 5 * v
    sim, live = _live(6400 + v, start + 40)
    live.failing[("rollout", rank)] = (start, 10_000, 2.0, 1.0, 1.0)
    return (
        sim,
        [exp("rollout_engine_requests_failing", start, 12, role="rollout", rank=rank, node=node)],
        ("an engine whose requests finish in errors and aborts, 3 of 4 of them"),
    )


def engine_preemption_storm(v: int):
    rank, node = v % 2, ("n1", "n2")[v % 2]
    start = 50 + 5 * v
    sim, live = _live(6500 + v, start + 50)
    live.preempting[("rollout", rank)] = (start, 10_000, 3.0)
    return (
        sim,
        [
            exp(
                "rollout_engine_preemption_storm",
                start,
                20,
                tier="light",
                role="rollout",
                rank=rank,
                node=node,
            )
        ],
        ("an engine preempting 3 requests a second (its KV cache exhausted)"),
    )


def engine_compiling(v: int):
    """A vLLM engine starting: its API server up from t=30, /health refused while it loads and
    compiles for 57 s (measured here, cold) or 150 s (a big model): within vllm's grace (300 s);
    then it answers and serves."""
    rank = v % 2
    sim, live = _live(6600 + v, 260)
    live.started[("rollout", rank)] = 30.0
    live.answers_from[("rollout", rank)] = 30.0 + (57, 150)[v % 2]
    return sim, [], "a vLLM engine compiling for 57 s or 150 s after its start (its start-up grace)"


def engine_busy(v: int):
    sim, _ = _live(6700 + v, 200)
    return (
        sim,
        [],
        "two vLLM engines under steady load: requests running and waiting, tokens rising",
    )


def engine_idle(v: int):
    sim, live = _live(6800 + v, 200)
    live.idle.add(("rollout", v % 2))
    return sim, [], "a vLLM engine idle for minutes: nothing running or waiting, no token"


def engine_probe_blip(v: int):
    sim, live = _live(6900 + v, 160)
    live.frozen[("rollout", v % 2)] = (60, 66)
    return sim, [], "an engine alive that misses its health probe for 6 s and answers again"


def engine_few_aborts(v: int):
    sim, live = _live(7000 + v, 200)
    live.failing[("rollout", v % 2)] = (60, 64, 0.0, 1.0, 20.0)
    return (
        sim,
        [],
        "a client cancels 4 requests while 80 others finish (aborts, not a broken engine)",
    )


def engine_some_preemptions(v: int):
    sim, live = _live(7100 + v, 200)
    live.preempting[("rollout", v % 2)] = (60, 100, 0.5)
    return sim, [], "an engine preempting now and then (20 in 40 s, under the storm's 50 a minute)"


def engine_stopped_with_its_job(v: int):
    """The job finishes and stops its engine: the rollout's phase turns DONE, then the engine's
    processes exit (as a kill would, API server first)."""
    rank = v % 2
    sim, live = _live(7200 + v, 160)
    sim.hooks.append(at(60, 10_000, lambda s: s.phase.__setitem__(("rollout", rank), "DONE")))
    live.dead[("rollout", rank)] = ("api_server", 62)
    return sim, [], "the job finishes (phase DONE) and stops its vLLM engine: not a dead engine"


POSITIVE["engine_process_killed"] = (engine_process_killed, 3)
POSITIVE["engine_frozen"] = (engine_frozen, 2)
POSITIVE["engine_paused"] = (engine_paused, 2)
POSITIVE["engine_failing_requests"] = (engine_failing_requests, 2)
POSITIVE["engine_preemption_storm"] = (engine_preemption_storm, 2)
NEGATIVE["engine_compiling"] = (engine_compiling, 2)
NEGATIVE["engine_busy"] = (engine_busy, 1)
NEGATIVE["engine_idle"] = (engine_idle, 2)
NEGATIVE["engine_probe_blip"] = (engine_probe_blip, 1)
NEGATIVE["engine_few_aborts"] = (engine_few_aborts, 1)
NEGATIVE["engine_some_preemptions"] = (engine_some_preemptions, 1)
NEGATIVE["engine_stopped_with_its_job"] = (engine_stopped_with_its_job, 1)

# -- train_hang from the very first step: the first-step budget ----------------------------------

FIRST_STEP_BUDGET = 420  # detection.trainer.first_step_budget_seconds.trainer
TRAINER_GRACE = 120  # detection.startup.startup_grace_seconds.trainer


def first_step_hang(v: int):
    """A fresh job whose trainers never finish step 0: a collective that never completes at
    rendezvous, GPUs spinning at 100 %, heartbeats fresh. A fault in the job's first step is
    heavy (RobustRL's escalation)."""
    sim = Sim(seed=7800 + v, duration=FIRST_STEP_BUDGET + 30)
    sim.step = 0
    sim.trainer_util = 1.0
    return (
        sim,
        [
            exp("train_hang", 0, FIRST_STEP_BUDGET, tier="heavy", role="trainer", rank=r, node="n0")
            for r in (0, 1)
        ],
        ("both trainers hang in their first step (rendezvous collective), GPUs at 100 %"),
    )


def _restart_then(
    rank: int, restart: float, load: float, first_step: float | None, every: float = 3.0
):
    """Trainer ``rank`` steps every ``every`` s from step 20; at ``restart`` its launcher
    restarts it (STARTING for ``load`` s, resumed from the checkpoint of step 15), then its
    first step takes ``first_step`` s (None: it never finishes), then ``every`` s steps."""

    def hook(t: float, sim: Sim) -> None:
        rel = t - T0
        key = ("trainer", rank)
        if rel < restart:
            sim.rank_step[key] = 20 + int(rel // every)
            sim.phase[key] = "TRAIN"
        elif rel < restart + load:
            sim.rank_step[key] = 15
            sim.phase[key] = "STARTING"
        else:
            sim.phase[key] = "TRAIN"
            done = rel - restart - load
            if first_step is None or done < first_step:
                sim.rank_step[key] = 15
            else:
                sim.rank_step[key] = 16 + int((done - first_step) // every)

    return hook


def first_step_hang_after_restart(v: int):
    """Restarted (say after an OOM), trainer-{rank} hangs in its first step: the budget counts
    from the end of its start-up grace (the load reported as STARTING counts for nothing)."""
    rank, restart, load = v % 2, 40 + 5 * v, 10 + 20 * v
    sim = Sim(seed=7900 + v, duration=restart + TRAINER_GRACE + FIRST_STEP_BUDGET + 30)
    sim.hooks.append(_restart_then(rank, restart, load, None))
    sim.hooks.append(_restart_then(1 - rank, 10_000, 0, None))  # its peer steps on
    return (
        sim,
        [
            exp(
                "train_hang",
                restart,
                TRAINER_GRACE + FIRST_STEP_BUDGET,
                role="trainer",
                rank=rank,
                node="n0",
            )
        ],
        (f"trainer-{rank} is restarted, loads for {load} s (STARTING) and hangs in its first step"),
    )


def first_step_within_budget(v: int):
    """Twin: restarted, trainer-{rank} loads 100 s (STARTING) and its first step takes 380 s
    after the grace (compilation, warm-up), within the budget; then 3 s steps."""
    rank, restart = v % 2, 40
    sim = Sim(seed=8000 + v, duration=restart + 100 + 20 + 380 + 90)
    sim.hooks.append(_restart_then(rank, restart, 100, 20 + 380))
    sim.hooks.append(_restart_then(1 - rank, 10_000, 0, None))
    return (
        sim,
        [],
        (
            f"trainer-{rank} restarts, loads 100 s, then a 380 s first step (budget "
            f"{FIRST_STEP_BUDGET} s) and steps on"
        ),
    )


def long_load_starting(v: int):
    """Twin: restarted trainers load their model for 110 s reported as STARTING (within their
    120 s start-up grace), then take 400 s for their first step: 510 s from the restart, but
    only the 390 s after the grace count against the 420 s budget."""
    restart = 30
    sim = Sim(seed=8100 + v, duration=restart + 110 + 400 + 90)
    for rank in (0, 1):
        sim.hooks.append(_restart_then(rank, restart, 110, 400))
    return (
        sim,
        [],
        ("trainers restart, load for 110 s (STARTING), then a 400 s first step and 3 s steps"),
    )


def exit_cuda_error(v: int):
    start, rank = 40 + 6 * v, v % 2
    sim = Sim(seed=8200 + v, duration=start + 30)
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    _exit(sim, "trainer", rank, start, ("cuda_illegal_access", "cuda_error", line))
    return (
        sim,
        [exp("cuda_error", start, 0, role="trainer", rank=rank, node="n0")],
        (f"trainer-{rank} dies of an illegal memory access"),
    )


POSITIVE["exit_cuda_error"] = (exit_cuda_error, 1)
POSITIVE["first_step_hang"] = (first_step_hang, 1)
POSITIVE["first_step_hang_after_restart"] = (first_step_hang_after_restart, 2)
NEGATIVE["first_step_within_budget"] = (first_step_within_budget, 2)
NEGATIVE["long_load_starting"] = (long_load_starting, 1)


def _same_step_restart(
    sim: Sim, rank: int, restart: float, first_step: float | None, every: float = 3.0
) -> None:
    """Trainer ``rank`` steps every ``every`` s from step 20; at ``restart`` its own launcher
    (torchrun, a site's retry loop, a warm standby) restarts it faster than the agent reports:
    no STARTING is seen and it resumes at the step it was on (checkpointed every step). Only
    the pid behind its heartbeat changes (``participant_pid``). Its first step then takes
    ``first_step`` s (None: it never finishes), then ``every`` s steps. The peer steps on."""

    def hook(t: float, sim: Sim) -> None:
        rel = t - T0
        for r in (0, 1):
            sim.phase[("trainer", r)] = "TRAIN"
            if r != rank or rel < restart:
                sim.rank_step[("trainer", r)] = 20 + int(rel // every)
                continue
            done = rel - restart
            at_restart = 20 + int(restart // every)
            if first_step is None or done < first_step:
                sim.rank_step[("trainer", r)] = at_restart
            else:
                sim.rank_step[("trainer", r)] = at_restart + 1 + int((done - first_step) // every)

    def pid(sim: Sim, role: str, r: int, t: float, add: Callable[[str, float], None]) -> None:
        if role == "trainer":
            add("participant_pid", 4100 + 10 * r + (1 if r == rank and t - T0 >= restart else 0))

    sim.hooks.append(hook)
    sim.part_samples.append(pid)


def first_step_hang_after_same_step_restart(v: int):
    """Restarted by its own launcher at the step it was on (only its pid tells), trainer-{rank}
    hangs in the new process's first step: the budget counts from the restart, not the old
    process's pace from its last step. The restart is seen at the next batch (+ 2 s)."""
    rank, restart = v % 2, 60 + 7 * v
    sim = Sim(seed=8300 + v, duration=restart + FIRST_STEP_BUDGET + 30)
    _same_step_restart(sim, rank, restart, None)
    return (
        sim,
        [exp("train_hang", restart, FIRST_STEP_BUDGET + 2, role="trainer", rank=rank, node="n0")],
        (
            f"trainer-{rank} is restarted at the same step (a new pid, no STARTING) and hangs in "
            "its first step"
        ),
    )


def long_first_step_after_same_step_restart(v: int):
    """Twin: restarted at the same step (a new pid only), trainer-{rank}'s first step takes
    300 s (load, compile, warm-up): over its pace's 120 s limit, within the first-step budget.
    Judged by the old process's pace it was train_hang; it is a first step."""
    rank, restart = v % 2, 60 + 7 * v
    sim = Sim(seed=8400 + v, duration=restart + 300 + 90)
    _same_step_restart(sim, rank, restart, 300)
    return (
        sim,
        [],
        (
            f"trainer-{rank} restarts at the same step (a new pid, no STARTING), a "
            f"300 s first step (budget {FIRST_STEP_BUDGET} s), then 3 s steps"
        ),
    )


POSITIVE["first_step_hang_after_same_step_restart"] = (first_step_hang_after_same_step_restart, 2)
NEGATIVE["long_first_step_after_same_step_restart"] = (long_first_step_after_same_step_restart, 2)


# -- stragglers in groups of 2 and 3 (the small-group rule) --------------------------------------

SMALL3_LAYOUT = {
    "n0": [("trainer", r) for r in range(3)],
    **{f"n{r + 1}": [("rollout", r)] for r in range(3)},
}


def _rollout_rates(rates: dict[int, float], start: float) -> Callable[[Sim], None]:
    def slow(s: Sim) -> None:
        for rank, rate in rates.items():
            s.part_override[(rank, "rollout", "rollout_tokens_per_second")] = rate

    return at(start, 10_000, slow)


def straggler_pair(v: int):
    """The default job's two rollouts: rollout-{rank} drops to 300 tokens/s (its peer
    800-1500): a group of two, judged by the small-group rule."""
    start, rank = 50 + 7 * v, v % 2
    sim = Sim(seed=8300 + v, duration=start + STRAGGLER_SUSTAIN + 40)
    sim.hooks.append(_rollout_rates({rank: 300.0}, start))
    node = ("n1", "n2")[rank]
    return (
        sim,
        [exp("straggler", start, STRAGGLER_SUSTAIN + 5, role="rollout", rank=rank, node=node)],
        f"rollout-{rank} of two falls to 300 tokens/s",
    )


def straggler_trio_trainer(v: int):
    """Three trainer ranks stepping independently: trainer-{rank} slows from 3 s to 9 s steps."""
    start, rank = 45 + 7 * v, (2, 0)[v % 2]
    every: dict[int, float] = {}
    sim = Sim(seed=8400 + v, duration=start + 36 + STRAGGLER_SUSTAIN + 30, layout=SMALL3_LAYOUT)
    sim.hooks.append(_own_pace(every))
    sim.hooks.append(at(start, 10_000, lambda s: every.__setitem__(rank, 9.0)))
    window = (PACE_STEPS // 2 + 2) * 9 + STRAGGLER_SUSTAIN
    return (
        sim,
        [exp("straggler", start, window, role="trainer", rank=rank, node="n0")],
        (f"trainer-{rank} of three steps every 9 s, its 2 peers every 3 s"),
    )


def straggler_trio_two_slow(v: int):
    sim = Sim(seed=8500 + v, duration=60 + STRAGGLER_SUSTAIN + 90, layout=SMALL3_LAYOUT)
    sim.hooks.append(_rollout_rates({0: 420.0, 2: 380.0}, 60))
    return sim, [], "two of three rollouts fall to ~400 tokens/s: neither is far from the other"


def straggler_trio_uniform_slow(v: int):
    sim = Sim(seed=8600 + v, duration=60 + STRAGGLER_SUSTAIN + 90, layout=SMALL3_LAYOUT)
    sim.hooks.append(_rollout_rates({0: 420.0, 1: 400.0, 2: 380.0}, 60))
    return sim, [], "all three rollouts fall to ~400 tokens/s together (a longer prompt mix)"


def straggler_trio_spread_normal(v: int):
    """A slower GPU type from the start: rollout-{rank} runs at 420 tokens/s all along."""
    rank = (1, 0)[v % 2]
    sim = Sim(seed=8700 + v, duration=STRAGGLER_SUSTAIN * 3, layout=SMALL3_LAYOUT)
    sim.hooks.append(_rollout_rates({rank: 420.0}, 0))
    return sim, [], f"rollout-{rank} of three is 2-3x slower than its peers from the start"


POSITIVE["straggler_pair"] = (straggler_pair, 2)
POSITIVE["straggler_trio_trainer"] = (straggler_trio_trainer, 2)
NEGATIVE["straggler_trio_two_slow"] = (straggler_trio_two_slow, 1)
NEGATIVE["straggler_trio_uniform_slow"] = (straggler_trio_uniform_slow, 1)
NEGATIVE["straggler_trio_spread_normal"] = (straggler_trio_spread_normal, 2)


# -- cross-role deadlock: the trainer waits for data no rollout produces --------------------------

DEADLOCK_SUSTAIN = 90  # detection.deadlock.sustain_seconds


def _rollouts_idle(s: Sim) -> None:
    for rank in (0, 1):
        s.part_override[(rank, "rollout", "rollout_tokens_per_second")] = 0.0


def _rollouts_busy(s: Sim) -> None:
    for rank in (0, 1):
        s.part_override.pop((rank, "rollout", "rollout_tokens_per_second"), None)


def cross_role_deadlock(v: int):
    """The trainers wait in {phase} for a batch (step frozen) while both rollouts sit idle with
    nothing pending, heartbeats fresh (a failed sample taken for end-of-data): one incident."""
    phase = ("COLLECT", "ROLLOUT")[v % 2]
    start = 40 + 10 * v
    sim = Sim(seed=8800 + v, duration=start + DEADLOCK_SUSTAIN + 40)
    sim.hooks.append(stepping(3, frozen=lambda rel: rel >= start))
    sim.hooks.append(at(start, 10_000, _trainers(phase)))
    sim.hooks.append(at(start, 10_000, _rollouts_idle))
    return (
        sim,
        [exp("cross_role_deadlock", start, DEADLOCK_SUSTAIN, role="rollout")],
        (f"trainers wait in {phase} for data while every rollout idles with nothing pending"),
    )


def trainer_waits_rollouts_busy(v: int):
    sim = Sim(seed=8900 + v, duration=40 + 200 + 30)
    sim.hooks.append(stepping(3, frozen=lambda rel: 40 <= rel < 240))
    sim.hooks.append(at(40, 240, _trainers("COLLECT"), _trainers("TRAIN")))
    return sim, [], "trainers wait 200 s in COLLECT while the rollouts generate (a slow batch)"


def rollouts_idle_trainer_trains(v: int):
    sim = Sim(seed=9000 + v, duration=40 + 200 + 30)
    sim.hooks.append(stepping(3))
    sim.hooks.append(at(40, 240, _rollouts_idle, _rollouts_busy))
    return sim, [], "rollouts idle 200 s (nothing asked of them) while the trainers train"


def deadlock_resolves_itself(v: int):
    """Both sides wait 70 s (a weight push, a slow data loader), then data flows again."""
    sim = Sim(seed=9100 + v, duration=40 + 70 + 90)
    sim.hooks.append(stepping(3, frozen=lambda rel: 40 <= rel < 110))
    sim.hooks.append(at(40, 110, _trainers("COLLECT"), _trainers("TRAIN")))
    sim.hooks.append(at(40, 110, _rollouts_idle, _rollouts_busy))
    return sim, [], "trainers wait and rollouts idle together for 70 s, then work resumes"


def deadlock_after_the_trainer_froze(v: int):
    """The trainers wait in ROLLOUT (a hang phase too) from ``start``, step frozen, while the
    rollouts go on generating for ``busy`` s (a batch that is then lost, a failed sample taken
    for end-of-data) and then idle with nothing pending. train_hang's 120 s clock runs from the
    freeze, the deadlock's window from the rollouts' idleness: the deadlock is the fault (its
    plan restarts the rollouts), the trainer is not hung by itself."""
    busy = (60, 95)[v % 2]
    start = 40 + 10 * v
    sim = Sim(seed=9200 + v, duration=start + busy + DEADLOCK_SUSTAIN + 40)
    sim.hooks.append(stepping(3, frozen=lambda rel: rel >= start))
    sim.hooks.append(at(start, 10_000, _trainers("ROLLOUT")))
    sim.hooks.append(at(start + busy, 10_000, _rollouts_idle))
    return (
        sim,
        [exp("cross_role_deadlock", start + busy, DEADLOCK_SUSTAIN, role="rollout")],
        (
            f"trainers wait in ROLLOUT while the rollouts generate {busy} s more, then idle: "
            "the deadlock, not train_hang"
        ),
    )


POSITIVE["cross_role_deadlock"] = (cross_role_deadlock, 2)
POSITIVE["deadlock_after_the_trainer_froze"] = (deadlock_after_the_trainer_froze, 2)
NEGATIVE["trainer_waits_rollouts_busy"] = (trainer_waits_rollouts_busy, 1)
NEGATIVE["rollouts_idle_trainer_trains"] = (rollouts_idle_trainer_trains, 1)
NEGATIVE["deadlock_resolves_itself"] = (deadlock_resolves_itself, 1)


# -- rollouts that fail while the job goes on: the failed-samples ratio ---------------------------


def _samples(failing: Callable[[float], float], total: bool = True) -> Callable[..., None]:
    """Both rollouts finish 8 generations a second; ``failing(rel)`` of them fail from then on
    (a share, integrated); ``total``: whether they report their finished total too."""
    done: dict[int, list[float]] = {}

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[..., None]) -> None:
        if role != "rollout":
            return
        acc = done.setdefault(rank, [0.0, 0.0, -1.0])
        if acc[2] != t:
            acc[2] = t
            acc[0] += 8
            acc[1] += 8 * failing(t - T0)
        if total:
            add("rollout_samples_total", int(acc[0]))
        add("rollout_failed_samples_total", int(acc[1]))

    return sample


def samples_failing(v: int):
    """From {start} s, {share:.0%} of the rollouts' generations fail (an engine returning
    empty completions the framework counts as data)."""
    start, share = 60 + 10 * v, (0.5, 0.35)[v % 2]
    sim = Sim(seed=9200 + v, duration=start + 140)
    sim.part_samples.append(_samples(lambda rel: share if rel >= start else 0.01))
    # the window (120 s) must hold 30 % failures: most of it after the start
    return (
        sim,
        [exp("rollout_samples_failing", start, 120, role="rollout")],
        (f"{share:.0%} of the rollouts' generations fail from t+{start}s"),
    )


def samples_few_failures(v: int):
    sim = Sim(seed=9300 + v, duration=300)
    sim.part_samples.append(_samples(lambda rel: 0.05))
    return sim, [], "5 % of the generations fail all along (a normal share of bad prompts)"


def samples_failures_without_total(v: int):
    sim = Sim(seed=9400 + v, duration=200)
    sim.part_samples.append(_samples(lambda rel: 0.01, total=False))
    return sim, [], "a few failed generations, no total reported: fewer than the minimum"


POSITIVE["samples_failing"] = (samples_failing, 2)
NEGATIVE["samples_few_failures"] = (samples_few_failures, 1)
NEGATIVE["samples_failures_without_total"] = (samples_failures_without_total, 1)


# -- train/inference disagreement per rollout engine (workload/engines/: rollout_logprob_diff_mean) --


def _logprob_diffs(levels: dict[int, float]) -> Callable[..., None]:
    """Each rollout engine reports its mean |trainer - engine| logprob of the last step: about
    1e-7 nats (an fp32 engine), or ``levels[rank]`` while set; a new figure every 3 s, drawn
    from a generator of its own so that the cluster's stays as it was."""
    rng = random.Random(23)
    held: dict[int, tuple[int, float]] = {}

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[[str, float], None]) -> None:
        if role != "rollout":
            return
        step = int(t) // 3
        if held.get(rank, (-1, 0.0))[0] != step:
            held[rank] = (step, levels.get(rank, 1e-7) * rng.uniform(0.8, 1.2))
        add("rollout_logprob_diff_mean", held[rank][1])

    return sample


def train_infer_stale_engine(v: int):
    start, rank = 60 + 5 * v, v % 2
    levels: dict[int, float] = {}
    sim = Sim(seed=8400 + v, duration=start + 40)
    sim.part_samples.append(_logprob_diffs(levels))
    sim.hooks.append(at(start, 10_000, lambda s: levels.__setitem__(rank, 0.3)))
    return (
        sim,
        [exp("train_infer_mismatch", start, 6, role="rollout", rank=rank, node=("n1", "n2")[rank])],
        (
            f"rollout engine {rank} is admitted with the previous step's weights: the trainer scores its "
            f"tokens 0.3 nats off, its peer 1e-7"
        ),
    )


def train_infer_uniform(v: int):
    sim = Sim(seed=8500 + v, duration=200)
    sim.part_samples.append(_logprob_diffs({0: 0.05, 1: 0.06}))
    return (
        sim,
        [],
        "both engines disagree with the trainer alike (bf16 engines, an fp32 trainer): 0.05 nats",
    )


POSITIVE["train_infer_stale_engine"] = (train_infer_stale_engine, 2)
NEGATIVE["train_infer_uniform"] = (train_infer_uniform, 1)


# -- every-step snapshots that cannot be persisted (integrations/trl/snapshots.py) -----------------


def _persist_errors(
    first: float | None, carried: int = 0, every: float = 3.0
) -> Callable[..., None]:
    """Trainer 0's heartbeat: ``snapshot_persist_errors_total`` (``carried`` from the process
    before a restart), one more per snapshot every ``every`` s from ``first`` (the persist
    directory full), and the last error's directory and text."""

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[..., None]) -> None:
        if (role, rank) != ("trainer", 0):
            return
        rel = t - T0
        total = carried + (
            int((rel - first) // every) + 1 if first is not None and rel >= first else 0
        )
        add("snapshot_persist_errors_total", total)
        if total:
            add(
                "snapshot_persist_last_error",
                total,
                dir=f"/runs/{JOB}/snapshots/rank-0",
                error="[Errno 28] No space left on device",
            )

    return sample


def snapshot_persist_errors(v: int):
    start = 50 + 8 * v
    sim = Sim(seed=9700 + v, duration=start + 60)
    sim.part_samples.append(_persist_errors(start, every=(3.0, 10.0)[v % 2]))
    return (
        sim,
        [
            exp(
                "checkpoint_write_errors",
                start,
                0,
                tier="medium",
                role="trainer",
                rank=0,
                node="n0",
            )
        ],
        (
            "the persist directory of trainer 0's every-step snapshots is full: a medium, alert-only "
            "checkpoint_write_errors, not storage_unwritable (training goes on)"
        ),
    )


def snapshot_persist_errors_carried_over(v: int):
    sim = Sim(seed=9800 + v, duration=200)
    sim.part_samples.append(_persist_errors(None, carried=7))
    return sim, [], "7 persist errors carried over a restart, none new: no incident"


def reference_checkpoint_errors(v: int):
    start = 45 + 8 * v
    sim = Sim(seed=9900 + v, duration=start + 40)

    def sample(sim: Sim, role: str, rank: int, t: float, add: Callable[..., None]) -> None:
        if (role, rank) == ("trainer", 0):
            add("checkpoint_write_errors_total", 1 if t - T0 >= start else 0)

    sim.part_samples.append(sample)
    return (
        sim,
        [exp("storage_unwritable", start, 0, tier="heavy", role="trainer", rank=0, node="n0")],
        (
            "the job's own checkpoint save fails (checkpoint_write_errors_total): still storage_unwritable, heavy"
        ),
    )


POSITIVE["snapshot_persist_errors"] = (snapshot_persist_errors, 2)
POSITIVE["reference_checkpoint_errors"] = (reference_checkpoint_errors, 1)
NEGATIVE["snapshot_persist_errors_carried_over"] = (snapshot_persist_errors_carried_over, 1)


def _write_gz(path: Path, batches: list[dict[str, Any]]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for b in batches:
            gz.write((json.dumps(b, separators=(",", ":")) + "\n").encode())
    path.write_bytes(buf.getvalue())


def main(out_dir: Path = HERE) -> int:
    for old in out_dir.glob("*.jsonl.gz"):
        old.unlink()
    for old in out_dir.glob("*.labels.json"):
        old.unlink()
    total = 0
    for group, table in (("fault", POSITIVE), ("ok", NEGATIVE)):
        for name, (scenario, variants) in table.items():
            for v in range(variants):
                sim, expect, description = scenario(v)
                batches = simulate(sim)
                trace = f"{group}_{name}_{v}"
                _write_gz(out_dir / f"{trace}.jsonl.gz", batches)
                labels = {"name": trace, "description": description, "expect": expect}
                (out_dir / f"{trace}.labels.json").write_text(json.dumps(labels, indent=1) + "\n")
                total += 1
    print(f"wrote {total} traces to {out_dir}")
    return total


if __name__ == "__main__":
    main()
