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
from app.policy.detectors.clock import ClockSkewDetector
from app.policy.detectors.drift import EnvDriftDetector
from app.policy.detectors.external import ExternalAlertDetector, ExternalAlerts
from app.policy.detectors.golden_metrics import GoldenMetricDetector
from app.policy.detectors.gpu_health import GpuHealthDetector
from app.policy.detectors.hang import TrainHangDetector
from app.policy.detectors.heartbeat import HeartbeatDetector, NodeSilenceDetector
from app.policy.detectors.inference_engines import (
    EngineStalledDetector,
    InferenceEngineDownDetector,
)
from app.policy.detectors.job_failures import JobFailureDetector
from app.policy.detectors.ray_nodes import RayNodeDeadDetector
from app.policy.detectors.scheduler_nodes import SchedulerNodeDetector
from app.policy.detectors.storage import StorageDetector
from app.policy.detectors.straggler import StragglerDetector
from app.policy.policy_file import Policy

__all__ = [
    "AT_LEAST_ONE",
    "ClockSkewDetector",
    "Detector",
    "EngineStalledDetector",
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
    "RolloutStallDetector",
    "SchedulerNodeDetector",
    "StorageDetector",
    "StragglerDetector",
    "TrainHangDetector",
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
        EnvDriftDetector(policy),
        hang,
        InferenceEngineDownDetector(policy),
        EngineStalledDetector(policy),
        SchedulerNodeDetector(policy),
        RayNodeDeadDetector(policy),
        ClockSkewDetector(policy),
        StragglerDetector(policy, hang=hang),  # after hang: it reads the paces of this tick
    ]
