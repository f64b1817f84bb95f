"""Failures the job reports itself: failed steps counted per step."""

from __future__ import annotations

import pytest

from app.policy.detectors import JobFailureDetector
from app.policy.signals import FaultKind
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster

pytestmark = pytest.mark.timeout(30)


def test_step_failure_counts_same_step() -> None:
    c = Cluster()
    det = JobFailureDetector(c.policy)
    t = {"job": JOB, "role": "trainer", "rank": "0"}
    c.run(5, lambda c: c.put("n0", m.TRAIN_STEP_FAILURES_TOTAL, 0, **t), detector=det)

    def fail(n: int):
        def f(c: Cluster) -> None:
            c.put("n0", m.TRAIN_STEP_FAILURES_TOTAL, n, **t)
            c.put("n0", m.TRAIN_LAST_FAILED_STEP, 42, **t)

        return f

    res = c.run(1, fail(1), detector=det)
    assert res[0][0].kind is FaultKind.STEP_FAILED and res[0][0].step == 42
    assert res[0][0].extra["same_step_failures"] == 1
    res = c.run(1, fail(2), detector=det)
    assert res[0][0].extra["same_step_failures"] == 2
