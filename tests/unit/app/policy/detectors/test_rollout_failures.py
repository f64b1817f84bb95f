"""rollout_samples_failing: a job's rollouts whose share of failed or empty generations
reaches the ratio over the window; a normal share, too few samples, no total, and a counter
reset are not."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from app.policy.detectors.rollout_failures import RolloutSampleFailureDetector
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(60)


def _rollouts(
    per_second: float, share: float, *, total: bool = True, reset_at: float | None = None
) -> Callable[[Cluster], None]:
    done = {0: [0.0, 0.0], 1: [0.0, 0.0]}

    def f(c: Cluster) -> None:
        for rank, acc in done.items():
            if reset_at is not None and c.now == reset_at:
                acc[0] = acc[1] = 0.0
            acc[0] += per_second
            acc[1] += per_second * share
            labels = {"job": JOB, "role": "rollout", "rank": str(rank)}
            if total:
                c.put(f"n{rank}", m.ROLLOUT_SAMPLES_TOTAL, int(acc[0]), **labels)
            c.put(f"n{rank}", m.ROLLOUT_FAILED_SAMPLES_TOTAL, int(acc[1]), **labels)
            c.participant("rollout", rank, f"n{rank}", phase="ROLLOUT")

    return f


def test_a_high_failure_share_is_one_job_incident() -> None:
    c = Cluster()
    det = RolloutSampleFailureDetector(c.policy)
    res = c.run(30, _rollouts(5, 0.5), detector=det)
    fired = first_firing(res)
    assert fired is not None and fired <= 5, fired
    [sig] = res[-1]
    assert sig.kind is FaultKind.ROLLOUT_SAMPLES_FAILING and sig.suggested_tier is Tier.MEDIUM
    assert sig.subject.to_dict() == {"job": JOB, "role": "rollout"}
    assert sig.extra["failed"] >= 0.45 * sig.extra["samples"]
    assert "generations of its rollouts failed or came back empty" in sig.evidence.detail


@pytest.mark.parametrize(
    "each",
    [
        _rollouts(5, 0.05),  # a normal share of bad prompts
        _rollouts(0.05, 0.9),  # few generations: under min_samples in the window
        _rollouts(5, 0.9, total=False),  # no denominator: no ratio
    ],
)
def test_no_incident_without_a_high_share_of_enough_samples(
    each: Callable[[Cluster], None],
) -> None:
    c = Cluster()
    det = RolloutSampleFailureDetector(c.policy)
    assert first_firing(c.run(200, each, detector=det)) is None


def test_a_counter_reset_is_not_a_drop_or_a_burst() -> None:
    c = Cluster()
    det = RolloutSampleFailureDetector(c.policy)
    reset = c.now + 60
    assert first_firing(c.run(200, _rollouts(5, 0.05, reset_at=reset), detector=det)) is None
