"""Storage: state-log or checkpoint writes that fail mean the storage is not writable."""

from __future__ import annotations

from app.policy import metric_names as m
from app.policy.detectors.base import Detector
from app.policy.detectors.counters import CounterWatch, NodeMemory, counter_signal
from app.policy.policy_file import Policy
from app.policy.signals import FaultKind, FaultSignal
from app.policy.world import CHANGED, World


class StorageDetector(Detector):
    """A rise of the state-log or checkpoint write-error counters: ``storage_unwritable``."""

    metrics = (m.STATE_LOG_WRITE_ERRORS_TOTAL, m.CHECKPOINT_WRITE_ERRORS_TOTAL)
    filters = {m.STATE_LOG_WRITE_ERRORS_TOTAL: CHANGED, m.CHECKPOINT_WRITE_ERRORS_TOTAL: CHANGED}

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = CounterWatch()
        self._nodes = NodeMemory()

    def detect(self, world: World) -> list[FaultSignal]:
        window = self.policy.detection.storage.error_window_seconds
        out = [
            counter_signal(self, world, FaultKind.STORAGE_UNWRITABLE, key, ep, window)
            for name in self.metrics
            for key, ep in self._counters.episodes_of(world, name, self._nodes, window)
        ]
        self._nodes.commit(world)
        return out
