"""Fault signals: what a detector saw, about whom, and why.

A signal is the unit between detection and classification. It is plain data (JSON-friendly) so
it can be stored with its incident and shown on the dashboard as the evidence for a decision.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    # golden metrics
    ROLLOUT_PENDING_HIGH = "rollout_pending_high"
    SHARD_REBUILD_STORM = "shard_rebuild_storm"
    STATE_LOG_SLOW = "state_log_slow"
    # storage
    STORAGE_UNWRITABLE = "storage_unwritable"
    # every-step snapshots that could not be persisted (full, unwritable): training goes on
    CHECKPOINT_WRITE_ERRORS = "checkpoint_write_errors"
    # role-aware idleness and liveness
    TRAINER_IDLE = "trainer_idle"
    TRAIN_HANG = "train_hang"
    ROLLOUT_DOWN = "rollout_down"
    ROLLOUT_ENGINE_DOWN = "rollout_engine_down"
    # an engine seen level by level (app/policy/detectors/inference_engines.py): a process of
    # its tree gone; alive but /health unanswered; answering but finishing nothing; failing
    # the requests it finishes; preempting in a storm (its KV cache exhausted)
    ROLLOUT_ENGINE_DEAD = "rollout_engine_dead"
    ROLLOUT_ENGINE_HUNG = "rollout_engine_hung"
    ROLLOUT_ENGINE_WEDGED = "rollout_engine_wedged"
    ROLLOUT_ENGINE_REQUESTS_FAILING = "rollout_engine_requests_failing"
    ROLLOUT_ENGINE_PREEMPTION_STORM = "rollout_engine_preemption_storm"
    HEARTBEAT_LOST = "heartbeat_lost"
    NODE_SILENT = "node_silent"
    NODES_LOST = "nodes_lost"
    NODE_UNAVAILABLE = "node_unavailable"  # the scheduler took the node out (DOWN, DRAIN)
    # step-level failures reported by the job
    STEP_FAILED = "step_failed"
    ROLLOUT_BATCH_TIMEOUT = "rollout_batch_timeout"
    SHARD_STALE = "shard_stale"
    # GPU health
    GPU_XID = "gpu_xid"
    GPU_ECC_UNCORRECTABLE = "gpu_ecc_uncorrectable"
    GPU_ROW_REMAP_FAILURE = "gpu_row_remap_failure"
    GPU_THROTTLED = "gpu_throttled"
    GPU_LOST = "gpu_lost"
    # several GPUs of one node failing together (a baseboard, a PCIe switch, the node's power):
    # one node-level incident with the GPUs as its evidence (app/policy/correlated.py)
    NODE_GPUS_FAILED = "node_gpus_failed"
    # environment
    ENV_DRIFT = "env_drift"
    CLOCK_SKEW = "clock_skew"  # a node's clock is off (its NTP is broken); stamps corrected
    # performance: a participant far slower than its peers (app/policy/detectors/straggler.py)
    STRAGGLER = "straggler"
    # an engine whose sampled tokens the trainer scores unlike the engine itself, against its
    # peers and its history (app/policy/detectors/train_infer_mismatch.py): stale weights
    TRAIN_INFER_MISMATCH = "train_infer_mismatch"
    # why a process failed, from its own output (the exit-cause catalogue,
    # recovery/supervision/exit_causes.yaml): its launcher matched a fatal line
    CUDA_OOM = "cuda_oom"
    CUDA_ERROR = "cuda_error"  # an illegal memory access, an uncorrectable ECC error ...
    HOST_OOM = "host_oom"  # the kernel's OOM killer ended it
    COLLECTIVE_TIMEOUT = "collective_timeout"  # the NCCL watchdog: a peer never joined
    # the trainer waits for data while every rollout idles with nothing pending (one per job)
    CROSS_ROLE_DEADLOCK = "cross_role_deadlock"
    # a rising share of a job's generations fail or come back empty (rollout_failed_samples)
    ROLLOUT_SAMPLES_FAILING = "rollout_samples_failing"
    # anything Alertmanager sends that the label mapping does not place elsewhere
    EXTERNAL_ALERT = "external_alert"
    # more incidents about one node in a minute than node_quotas.incidents_per_minute: one
    # incident about the flood, the rest held back (app/policy/open_budget.py)
    INCIDENT_FLOOD = "incident_flood"


class Tier(StrEnum):
    """How much a fault's recovery may do, in order: light < medium < heavy.

    The one tier of the project (the policy classifies with it, incidents store its value,
    alerts filter and group by it). Tiers compare by severity, not as strings ("heavy" sorts
    before "light" alphabetically); comparing a tier with a plain string is a TypeError.
    """

    LIGHT = "light"
    MEDIUM = "medium"
    HEAVY = "heavy"

    @property
    def rank(self) -> int:
        """0 for light, 1 for medium, 2 for heavy."""
        return _TIER_RANK[self]

    def _rank_of(self, other: object) -> int:
        if not isinstance(other, Tier):
            raise TypeError(f"a Tier compares only with a Tier, not {type(other).__name__}")
        return other.rank

    def __lt__(self, other: str) -> bool:
        return self.rank < self._rank_of(other)

    def __le__(self, other: str) -> bool:
        return self.rank <= self._rank_of(other)

    def __gt__(self, other: str) -> bool:
        return self.rank > self._rank_of(other)

    def __ge__(self, other: str) -> bool:
        return self.rank >= self._rank_of(other)


_TIER_RANK = {Tier.LIGHT: 0, Tier.MEDIUM: 1, Tier.HEAVY: 2}


@dataclass(frozen=True, slots=True)
class Subject:
    """Whom a signal is about; unset parts are not part of the subject."""

    node: str | None = None
    job: str | None = None
    role: str | None = None
    rank: int | None = None
    gpu: str | None = None

    def key(self) -> str:
        """A stable text key: same subject, same key (used to group signals into incidents)."""
        parts = [
            f"{name}={value}"
            for name, value in (
                ("job", self.job),
                ("role", self.role),
                ("rank", self.rank),
                ("node", self.node),
                ("gpu", self.gpu),
            )
            if value is not None
        ]
        return "/".join(parts) or "cluster"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Subject:
        rank = data.get("rank")
        return cls(
            node=data.get("node"),
            job=data.get("job"),
            role=data.get("role"),
            rank=int(rank) if rank is not None else None,
            gpu=None if data.get("gpu") is None else str(data["gpu"]),
        )


@dataclass(frozen=True, slots=True)
class Evidence:
    """Why a detector fired: the values it looked at, over which window, against what."""

    metric: str | None
    values: tuple[tuple[float, float], ...] = ()  # (ts, value), oldest first, capped
    window_seconds: float = 0.0
    threshold: float | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "values": [list(v) for v in self.values],
            "window_seconds": self.window_seconds,
            "threshold": self.threshold,
            "detail": self.detail,
        }


MAX_EVIDENCE_POINTS = 60


def cap_points(points: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Keep evidence small: the newest ``MAX_EVIDENCE_POINTS`` samples."""
    return tuple(points[-MAX_EVIDENCE_POINTS:])


@dataclass(frozen=True, slots=True)
class FaultSignal:
    kind: FaultKind
    subject: Subject
    evidence: Evidence
    suggested_tier: Tier
    detected_at: float
    # Since when the condition holds (first breaching sample, last heartbeat ...): the dashboard
    # shows it, and replay uses it to measure how long detection took.
    since: float | None = None
    step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # Signals of other kinds with the same root cause, folded into this one by the engine (a
    # GPU lost from the bus beside the XID 79 that announced it): one incident, not two.
    related: tuple[FaultSignal, ...] = ()

    @property
    def incident_key(self) -> str:
        return f"{self.kind.value}:{self.subject.key()}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind.value,
            "subject": self.subject.to_dict(),
            "evidence": self.evidence.to_dict(),
            "suggested_tier": self.suggested_tier.value,
            "detected_at": self.detected_at,
            "since": self.since,
            "step": self.step,
            "extra": dict(self.extra),
        }
        if self.related:  # absent otherwise: the stored shape of a lone signal stays as it was
            out["related"] = [r.to_dict() for r in self.related]
        return out
