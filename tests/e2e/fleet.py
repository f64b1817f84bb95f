"""Agent batches for a small, believable cluster: 2 nodes x 8 GPUs and one GRPO job.

The values move (sine waves plus a little noise) so charts have shape; the job's rollout
pending ratio drifts up into its amber band (but not past the 0.3 warning line, which would open
an incident of its own). Everything goes through the ingest API.
"""

from __future__ import annotations

import math
import random
import time

from tests.e2e._cluster import NODES, Cluster

GIB = 2**30
JOB = "grpo-qwen-7b"
GPUS = 8
CHECKPOINT_EVERY = 25
PHASE_CYCLE_S = 24.0
PHASE_CYCLE = {  # role -> (phase, until second of the cycle)
    "trainer": (("ROLLOUT", 8.0), ("COLLECT", 12.0), ("TRAIN", 20.0), ("EVAL", 24.0)),
    "rollout": (("ROLLOUT", 12.0), ("COLLECT", 16.0), ("PREPARE", 24.0)),
}
PLACEMENT = {  # node → (role, rank)
    NODES[0]: ("trainer", 0),
    NODES[1]: ("rollout", 1),
}


def _gpu_samples(node_i: int, ts: float, rng: random.Random) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for gpu in range(GPUS):
        wave = math.sin(ts / 40.0 + gpu * 0.8 + node_i)
        values = {
            "gpu_utilization_ratio": min(
                1.0, max(0.0, 0.83 + 0.1 * wave + rng.uniform(-0.03, 0.03))
            ),
            "gpu_temperature_celsius": 66 + 5 * wave + (9 if node_i == 1 and gpu == 5 else 0),
            "gpu_memory_used_bytes": (60 + 9 * wave) * GIB,
            "gpu_memory_total_bytes": 80 * GIB,
            "gpu_power_watts": 540 + 110 * wave,
            "gpu_xid_critical_events_total": 0,
            "gpu_ecc_uncorrected_errors_total": 0,
        }
        out.extend(
            {"name": name, "value": float(v), "ts": ts, "labels": {"gpu": str(gpu)}}
            for name, v in values.items()
        )
    return out


def _job_samples(node: str, ts: float, progress: float, errors: int) -> list[dict[str, object]]:
    role, rank = PLACEMENT[node]
    labels = {"job": JOB, "role": role, "rank": str(rank)}
    step = 40 + int(progress * 20)
    values: dict[str, float] = {
        "train_step": step,
        "state_log_write_latency_ms": 18 + 14 * math.sin(ts / 25.0) + (120 * progress**6),
        "state_log_write_errors_total": errors,
        "actor_shard_rebuild_count_5m": 1 if 0.55 < progress < 0.7 else 0,
    }
    if role == "trainer":
        # The last committed checkpoint (every 25 steps): step 25 early in the backfill, then 50.
        committed = step // CHECKPOINT_EVERY * CHECKPOINT_EVERY
        values["checkpoint_committed_step"] = committed
        values["checkpoint_inference_version"] = committed // CHECKPOINT_EVERY + 10
    if role == "rollout":
        values["rollout_pending_ratio"] = 0.04 + 0.21 * progress**3
        values["rollout_tokens_per_second"] = 5200 + 600 * math.sin(ts / 30.0)
    return [{"name": n, "value": float(v), "ts": ts, "labels": labels} for n, v in values.items()]


def phase_at(role: str, ts: float) -> str:
    """The phase machine's cycle, on the wall clock: the agents' heartbeats move through it, so
    the Job page's timeline fills with bands while the tests run."""
    at = ts % PHASE_CYCLE_S
    for phase, until in PHASE_CYCLE[role]:
        if at < until:
            return phase
    raise AssertionError(f"cycle of {role} does not cover {at}")


def _participant(node: str, ts: float, progress: float) -> dict[str, object]:
    role, rank = PLACEMENT[node]
    return {
        "job": JOB,
        "role": role,
        "rank": rank,
        "phase": phase_at(role, ts),
        "step": 40 + int(progress * 20),
        "ts": ts,
    }


def backfill(cluster: Cluster, *, seconds: int = 240, every: int = 5, seed: int = 3) -> None:
    """History for the charts: one batch per node every ``every`` seconds up to now."""
    rng = random.Random(seed)
    now = time.time()
    for back in range(seconds, -1, -every):
        ts = now - back
        progress = 1 - back / seconds
        for i, node in enumerate(NODES):
            # Participants (heartbeats) only with the newest batch: a heartbeat minutes old
            # would rightly look like a silent process to the policy engine.
            cluster.ingest(
                node,
                _gpu_samples(i, ts, rng) + _job_samples(node, ts, progress, errors=0),
                [_participant(node, ts, progress)] if back == 0 else [],
            )


def heartbeat(cluster: Cluster, *, errors: dict[str, int] | None = None, seed: int = 5) -> None:
    """One fresh batch per node (the agents' next round); ``errors`` sets state-log write errors."""
    rng = random.Random(seed)
    ts = time.time()
    for i, node in enumerate(NODES):
        cluster.ingest(
            node,
            _gpu_samples(i, ts, rng)
            + _job_samples(node, ts, 1.0, errors=(errors or {}).get(node, 0)),
            [_participant(node, ts, 1.0)],
        )


class Agents:
    """Both nodes' agents, reporting every ``interval`` seconds from a background thread.

    Without them the nodes would go silent and the policy engine would (rightly) open node-loss
    incidents. ``break_storage(node)`` makes that node's trainer/rollout report state-log write
    errors, and keeps the count rising so the storage fault stays active while tests look at it.
    """

    def __init__(self, cluster: Cluster, *, interval: float = 2.0) -> None:
        import threading

        self.cluster = cluster
        self.interval = interval
        self.errors: dict[str, int] = {}
        self._broken: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-agents", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> Agents:
        self._thread.start()
        return self

    def break_storage(self, node: str) -> None:
        with self._lock:
            self._broken.add(node)
            self.errors[node] = self.errors.get(node, 0) + 3

    def _run(self) -> None:
        rounds = 0
        while not self._stop.wait(self.interval):
            rounds += 1
            with self._lock:
                if rounds % 8 == 0:  # a new error every ~16 s keeps the fault's window open
                    for node in self._broken:
                        self.errors[node] += 1
                errors = dict(self.errors)
            try:
                heartbeat(self.cluster, errors=errors, seed=rounds)
            except BaseException as exc:  # noqa: BLE001 - reported by stop(), not swallowed
                self.failure = exc
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.failure is not None:
            raise AssertionError(
                f"the background agents failed: {self.failure!r}"
            ) from self.failure
