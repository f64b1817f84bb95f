"""Golden metrics: a breach that lasts its breach duration fires, a shorter one does not."""

from __future__ import annotations

import pytest

from app.policy.detectors import GoldenMetricDetector
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)

P = {"job": JOB, "role": "rollout", "rank": "0"}


# -- golden metrics ---------------------------------------------------------------------------


def test_pending_ratio_fires_after_breach_duration_with_evidence() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(20, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    res = c.run(40, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.6, **P), detector=det)
    fired = first_firing(res)
    assert fired is not None and 30 <= fired <= 31
    sig = res[fired - 1][0]
    assert sig.kind is FaultKind.ROLLOUT_PENDING_HIGH
    assert sig.subject.to_dict() == {"node": "n1", "job": JOB, "role": "rollout", "rank": 0}
    assert sig.evidence.threshold == 0.3 and sig.evidence.window_seconds == 30
    assert all(v > 0.3 for _, v in sig.evidence.values)
    assert sig.suggested_tier is Tier.LIGHT


def test_pending_ratio_spike_shorter_than_breach_does_not_fire() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(20, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    res = c.run(25, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.9, **P), detector=det)
    res += c.run(30, lambda c: c.put("n1", m.ROLLOUT_PENDING_RATIO, 0.05, **P), detector=det)
    assert first_firing(res) is None


def test_a_healthy_sample_restarts_the_clock_of_a_breach_that_has_not_fired() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    res = c.run(8, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    res += c.run(1, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 20, **P), detector=det)
    res += c.run(9, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert first_firing(res) is None  # 8 s, then 9 s: neither lasted the 10 s
    res = c.run(2, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert first_firing(res) is not None


def test_samples_between_healthy_and_warning_do_not_end_a_breach() -> None:
    """Hysteresis: latency swinging 150/250 ms around its 200 ms warning, never down to the
    50 ms healthy level, is one breach."""
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    swing = iter([250, 150] * 20)
    res = c.run(20, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, next(swing), **P),
                detector=det)  # fmt: skip
    fired = first_firing(res)
    assert fired is not None and 11 <= fired <= 12, res
    assert all(r for r in res[fired:]), "it keeps firing while the breach lasts"
    since = {r[0].since for r in res[fired - 1 :]}
    assert len(since) == 1  # one occurrence


def test_after_firing_a_new_breach_within_the_quiet_period_continues_it_at_once() -> None:
    """Minimum hold: high, healthy for 20 s (under the 30 s quiet period), high again: the
    signal comes back on the first breaching sample with the first breach's since, so its
    incident is not resolved and reopened; after a healthy spell longer than the quiet period
    a breach waits its full duration again."""
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    res = c.run(20, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    first = res[-1][0].since
    c.run(20, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 20, **P), detector=det)
    res = c.run(1, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    assert res[0] and res[0][0].since == first
    c.run(40, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 20, **P), detector=det)
    res = c.run(12, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 300, **P), detector=det)
    fired = first_firing(res)
    assert fired is not None and fired >= 10 and res[fired - 1][0].since != first


def test_shard_rebuild_count_is_inclusive_and_immediate() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    res = c.run(5, lambda c: c.put("n0", m.ACTOR_SHARD_REBUILD_COUNT_5M, 1, **P), detector=det)
    assert first_firing(res) is None
    res = c.run(1, lambda c: c.put("n0", m.ACTOR_SHARD_REBUILD_COUNT_5M, 2, **P), detector=det)
    assert res[0] and res[0][0].kind is FaultKind.SHARD_REBUILD_STORM


def test_stale_series_is_not_judged() -> None:
    c = Cluster()
    det = GoldenMetricDetector(c.policy)
    c.run(40, lambda c: c.put("n1", m.STATE_LOG_WRITE_LATENCY_MS, 500, **P), detector=det)
    res = c.run(20, lambda c: None, detector=det)  # no samples: the last breach is 20 s old
    assert res[-1] == []
