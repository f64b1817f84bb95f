"""Storage: failed state-log or checkpoint writes mean storage_unwritable (heavy)."""

from __future__ import annotations

import pytest

from app.policy import metric_names as m
from app.policy.detectors import StorageDetector
from app.policy.signals import FaultKind, Tier

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)


def test_state_log_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = StorageDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    res = c.run(1, lambda c: c.put("n0", m.STATE_LOG_WRITE_ERRORS_TOTAL, 4, **t), detector=det)
    assert res[0][0].kind is FaultKind.STORAGE_UNWRITABLE and res[0][0].suggested_tier is Tier.HEAVY


def test_checkpoint_write_errors_mean_storage_unwritable_heavy() -> None:
    c = Cluster()
    det = StorageDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
    assert (
        first_firing(
            c.run(3, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 0, **t), detector=det)
        )
        is None
    )  # a steady zero is no fault
    res = c.run(1, lambda c: c.put("n0", m.CHECKPOINT_WRITE_ERRORS_TOTAL, 1, **t), detector=det)
    sig = res[0][0]
    assert sig.kind is FaultKind.STORAGE_UNWRITABLE and sig.suggested_tier is Tier.HEAVY
    assert sig.evidence.metric == m.CHECKPOINT_WRITE_ERRORS_TOTAL
    assert sig.subject.to_dict() == {"node": "n0", "job": JOB, "role": "trainer", "rank": 0}
