"""Detectors: turn the series window and the participant table into fault signals.

``base`` holds what every detector shares; each other module is one family of faults. The
engine runs ``default_detectors(policy)`` on every tick (the server adds the external one).
"""

from __future__ import annotations

from app.policy.detectors.activity import RolloutStallDetector, TrainerIdleDetector
from app.policy.detectors.base import (
    AT_LEAST_ONE,
    Detector,
    at_least_one,
    breach_run,
    participant_subject,
    subject_of,
)
from app.policy.detectors.clock_skew import ClockSkewDetector
from app.policy.detectors.deadlock import CrossRoleDeadlockDetector
from app.policy.detectors.drift import EnvDriftDetector
from app.policy.detectors.external import ExternalAlertDetector, ExternalAlerts
from app.policy.detectors.golden_metrics import GoldenMetricDetector
from app.policy.detectors.gpu_health import GpuHealthDetector
from app.policy.detectors.hang import TrainHangDetector
from app.policy.detectors.heartbeat import HeartbeatDetector, NodeSilenceDetector
from app.policy.detectors.inference_engines import (
    EngineCounterDetector,
    EngineProcessDeadDetector,
    EngineStalledDetector,
    EngineWedgedDetector,
    InferenceEngineDownDetector,
)
from app.policy.detectors.job_failures import JobFailureDetector
from app.policy.detectors.ray_nodes import RayNodeDeadDetector
from app.policy.detectors.rollout_failures import RolloutSampleFailureDetector
from app.policy.detectors.scheduler_nodes import SchedulerNodeDetector
from app.policy.detectors.storage import SnapshotPersistDetector, StorageDetector
from app.policy.detectors.straggler import StragglerDetector
from app.policy.detectors.train_infer_mismatch import TrainInferMismatchDetector
from app.policy.policy_file import Policy

__all__ = [
    "AT_LEAST_ONE",
    "ClockSkewDetector",
    "CrossRoleDeadlockDetector",
    "Detector",
    "EngineCounterDetector",
    "EngineProcessDeadDetector",
    "EngineStalledDetector",
    "EngineWedgedDetector",
    "EnvDriftDetector",
    "ExternalAlertDetector",
    "ExternalAlerts",
    "GoldenMetricDetector",
    "GpuHealthDetector",
    "HeartbeatDetector",
    "InferenceEngineDownDetector",
    "JobFailureDetector",
    "NodeSilenceDetector",
    "RayNodeDeadDetector",
    "RolloutSampleFailureDetector",
    "RolloutStallDetector",
    "SchedulerNodeDetector",
    "SnapshotPersistDetector",
    "StorageDetector",
    "StragglerDetector",
    "TrainHangDetector",
    "TrainInferMismatchDetector",
    "TrainerIdleDetector",
    "at_least_one",
    "breach_run",
    "default_detectors",
    "participant_subject",
    "subject_of",
]


def default_detectors(policy: Policy) -> list[Detector]:
    """Every built-in detector, in the order the engine runs them."""
    hang = TrainHangDetector(policy)
    return [
        GoldenMetricDetector(policy),
        TrainerIdleDetector(policy),
        RolloutStallDetector(policy),
        HeartbeatDetector(policy),
        NodeSilenceDetector(policy),
        GpuHealthDetector(policy),
        JobFailureDetector(policy),
        StorageDetector(policy),
        SnapshotPersistDetector(policy),
        EnvDriftDetector(policy),
        hang,
        InferenceEngineDownDetector(policy),
        EngineStalledDetector(policy),
        EngineProcessDeadDetector(policy),
        EngineWedgedDetector(policy),
        EngineCounterDetector(policy),
        SchedulerNodeDetector(policy),
        RayNodeDeadDetector(policy),
        ClockSkewDetector(policy),
        StragglerDetector(policy, hang=hang),  # after hang: it reads the paces of this tick
        TrainInferMismatchDetector(policy),
        CrossRoleDeadlockDetector(policy),
        RolloutSampleFailureDetector(policy),
    ]
