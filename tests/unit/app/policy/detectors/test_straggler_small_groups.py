"""Stragglers in groups of 2 and 3: one that fell behind peers who agree, sustained, fires;
two slow of three, a uniformly slow group, a group whose spread is its normal, a rank its peer
merely overtook, and peers who disagree do not."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from app.policy.detectors import StragglerDetector
from app.policy.signals import FaultKind, FaultSignal, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(60)
SUSTAIN = 120


def _rollouts(rates: dict[int, float], seed: int = 3) -> Callable[[Cluster], None]:
    """Rollout r reports ``rates[r]`` tokens/s, ±25 % per sample (a real prompt mix)."""
    rng = random.Random(seed)

    def f(c: Cluster) -> None:
        for rank, rate in rates.items():
            c.put(
                f"n{rank}",
                m.ROLLOUT_TOKENS_PER_SECOND,
                rate * rng.uniform(0.75, 1.25),
                job=JOB,
                role="rollout",
                rank=str(rank),
            )
            c.participant("rollout", rank, f"n{rank}", phase="ROLLOUT")

    return f


def _fired(res: list[list[FaultSignal]]) -> set[tuple[str | None, int | None]]:
    return {(s.subject.role, s.subject.rank) for sigs in res for s in sigs}


@pytest.mark.parametrize("group", [2, 3])
def test_one_that_fell_behind_its_agreeing_peers_is_a_straggler(group: int) -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    healthy = dict.fromkeys(range(group), 1000.0)
    assert first_firing(c.run(60, _rollouts(healthy), detector=det)) is None
    res = c.run(SUSTAIN + 20, _rollouts({**healthy, 0: 300.0}), detector=det)
    fired = first_firing(res)
    assert fired is not None and SUSTAIN <= fired <= SUSTAIN + 8, fired
    assert _fired(res) == {("rollout", 0)}
    sig = res[-1][0]
    assert sig.kind is FaultKind.STRAGGLER and sig.suggested_tier is Tier.LIGHT
    assert sig.extra["small_group"] is True and sig.extra["peers"] == group - 1
    assert "a small group" in sig.evidence.detail


def test_two_slow_of_three_is_no_straggler() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    c.run(60, _rollouts({0: 1000, 1: 1000, 2: 1000}), detector=det)
    res = c.run(SUSTAIN + 60, _rollouts({0: 1000, 1: 350, 2: 350}), detector=det)
    assert first_firing(res) is None


def test_a_uniformly_slow_group_has_no_straggler() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    c.run(60, _rollouts({0: 1000, 1: 1000, 2: 1000}), detector=det)
    res = c.run(SUSTAIN + 60, _rollouts({0: 300, 1: 320, 2: 310}), detector=det)
    assert first_firing(res) is None


@pytest.mark.parametrize("rates", [{0: 1000, 1: 350}, {0: 1000, 1: 1000, 2: 350}])
def test_a_group_whose_spread_is_its_normal_has_no_straggler(rates: dict[int, float]) -> None:
    """A slower GPU type from the start: never in line with its peers, never fell behind."""
    c = Cluster()
    det = StragglerDetector(c.policy)
    assert first_firing(c.run(SUSTAIN * 3, _rollouts(rates), detector=det)) is None


def test_a_rank_its_peer_overtook_is_no_straggler() -> None:
    """Two trainers' own step times: rank 0 gets twice as fast (a smaller batch after a
    config change), rank 1 did not slow down: it is not the straggler."""
    c = Cluster()
    det = StragglerDetector(c.policy)

    def steps(times: dict[int, float]) -> Callable[[Cluster], None]:
        def f(cl: Cluster) -> None:
            for rank, t in times.items():
                cl.put("n0", m.TRAIN_STEP_SECONDS, t, job=JOB, role="trainer", rank=str(rank))
                cl.participant("trainer", rank, "n0", phase="TRAIN")

        return f

    c.run(60, steps({0: 6.0, 1: 6.0}), detector=det)
    assert first_firing(c.run(SUSTAIN + 60, steps({0: 2.5, 1: 6.0}), detector=det)) is None
    # ... but the same gap from rank 1 slowing down is a straggler
    c2 = Cluster()
    det2 = StragglerDetector(c2.policy)
    c2.run(60, steps({0: 6.0, 1: 6.0}), detector=det2)
    assert _fired(c2.run(SUSTAIN + 10, steps({0: 6.0, 1: 14.0}), detector=det2)) == {("trainer", 1)}


def test_peers_that_disagree_give_no_reference() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    c.run(60, _rollouts({0: 1000, 1: 1000, 2: 1000}), detector=det)
    # rank 1 and 2 drift apart (2x), rank 0 drops below half of both: no agreed pace
    res = c.run(SUSTAIN + 60, _rollouts({0: 240, 1: 1000, 2: 500}), detector=det)
    assert first_firing(res) is None


def test_a_lone_participant_has_no_peers() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    c.run(60, _rollouts({0: 1000}), detector=det)
    assert first_firing(c.run(SUSTAIN + 30, _rollouts({0: 100}), detector=det)) is None
