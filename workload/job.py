"""The reference job's configuration and run-directory layout, shared by all its processes.

The launcher writes ``job.json`` (what to run) and ``runtime.json`` (where the weight registry
and the checkpoint coordinator listen) into the run directory; the trainer and the rollout
workers read both. Everything else the processes share is files in the run directory.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recovery.fsio import replace_file
from recovery.supervision.events import EVENTS_FILE, append_event
from recovery.supervision.events import read_events as _read_events
from workload.task import TaskSpec

WEIGHT_SET = "policy"
# A weight version number is incarnation * VERSION_STRIDE + step: the registry wants versions to
# grow, and a restarted trainer republishes steps its predecessor already published.
VERSION_STRIDE = 1_000_000


# torch: the job's own sampler (workload/rollout.py); vllm: vLLM engines (workload/engines/).
ROLLOUT_ENGINES = ("torch", "vllm")


class JobConfigError(ValueError):
    """A job setting was refused; the message names it."""


@dataclass(frozen=True)
class JobConfig:
    job: str
    steps: int
    rollouts: int = 2
    seed: int = 1234
    lr: float = 0.01
    kl_coef: float = 0.05
    # Simulated decode latency per generated token: rollout time dominates a step, as in real RL.
    decode_ms_per_token: float = 15.0
    snapshot_interval_steps: int = 5
    task: TaskSpec = field(default_factory=TaskSpec)
    # Who generates the rollouts: the job's own torch sampler, or vLLM engines serving the Hugging
    # Face model in ``model_dir`` (workload/engines/), refit through ``transport``.
    rollout_engine: str = "torch"
    model_dir: str | None = None
    transport: str = "tcp"
    # With vLLM engines: the first step waits until every engine serves (a benchmark's clean
    # baseline on the whole fleet); otherwise the job starts on the first engine up.
    wait_all_engines: bool = False
    # With vLLM engines: seconds an engine quarantined for a transient reason (a failed request
    # or refit, its process tree alive) stays out before its probation probe; None: no
    # probation (only a replacement brings the rank back). See workload/engines/fleet.py.
    engine_probation_s: float | None = 30.0
    # With vLLM engines: a rollout request that has not finished after this many seconds failed
    # (the engine is quarantined as for any failed request, and the request retried elsewhere):
    # what catches an engine that answers /health but never finishes a request.
    engine_request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or self.steps < 1:
            raise JobConfigError(f"steps must be an int >= 1, got {self.steps!r}")
        if not isinstance(self.rollouts, int) or not 1 <= self.rollouts <= 64:
            raise JobConfigError(f"rollouts must be an int in 1..64, got {self.rollouts!r}")
        if not self.decode_ms_per_token >= 0:
            raise JobConfigError(
                f"decode_ms_per_token must be >= 0, got {self.decode_ms_per_token!r}"
            )
        if not self.lr > 0:
            raise JobConfigError(f"lr must be > 0, got {self.lr!r}")
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise JobConfigError(
                f"rollout_engine must be one of {', '.join(ROLLOUT_ENGINES)}, "
                f"got {self.rollout_engine!r}"
            )
        if self.rollout_engine == "vllm" and not self.model_dir:
            raise JobConfigError("rollout_engine 'vllm' needs model_dir (the model it serves)")
        if self.engine_probation_s is not None and not (
            isinstance(self.engine_probation_s, int | float) and self.engine_probation_s >= 0
        ):
            raise JobConfigError(
                f"engine_probation_s must be >= 0 or None, got {self.engine_probation_s!r}"
            )
        if not (
            isinstance(self.engine_request_timeout_s, int | float)
            and 0 < self.engine_request_timeout_s < math.inf
        ):
            raise JobConfigError(
                f"engine_request_timeout_s must be > 0, got {self.engine_request_timeout_s!r}"
            )
        if self.transport not in ("tcp", "shm"):
            raise JobConfigError(f"transport must be tcp or shm, got {self.transport!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> JobConfig:
        body = dict(data)
        body["task"] = TaskSpec(**body.get("task", {}))
        return cls(**body)


def write_json_atomic(path: Path, body: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps(body, sort_keys=True).encode())


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        return None  # being replaced right now: the next read sees the whole file
    return data if isinstance(data, dict) else None


class RunDir:
    """Paths inside one run directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    config = property(lambda self: self.root / "job.json")
    runtime = property(lambda self: self.root / "runtime.json")
    weights = property(lambda self: self.root / "weights.json")
    batches = property(lambda self: self.root / "batches")
    wal = property(lambda self: self.root / "wal")
    checkpoints = property(lambda self: self.root / "checkpoints")
    shards = property(lambda self: self.root / "shards")
    state_log = property(lambda self: self.root / "state_log.jsonl")
    chaos = property(lambda self: self.root / "chaos")
    requests = property(lambda self: self.root / "recovery" / "requests")
    launcher_requests = property(lambda self: self.root / "recovery" / "launcher")
    events = property(lambda self: self.root / EVENTS_FILE)
    consumed = property(lambda self: self.root / "consumed.jsonl")
    done = property(lambda self: self.root / "DONE")
    final = property(lambda self: self.root / "final.json")

    def load_config(self) -> JobConfig:
        data = read_json(self.config)
        if data is None:
            raise JobConfigError(f"{self.config} is missing or unreadable")
        return JobConfig.from_json(data)

    def batch_id(self, step: int, worker: int) -> str:
        return f"s{step:06d}-w{worker:02d}"

    def event(self, kind: str, **fields: Any) -> None:
        """Append one line to ``events.jsonl`` (the benchmark's timeline)."""
        append_event(self.events, kind, **fields)


def read_events(run: RunDir) -> list[dict[str, Any]]:
    return _read_events(run.events)
