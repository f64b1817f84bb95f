"""Stragglers: a rollout far below its peers' median throughput, a trainer far above their
median step time, sustained; a uniform slow fleet, too few peers and a short dip are not."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping

import pytest

from app.policy.detectors import StragglerDetector
from app.policy.detectors.straggler import _median_without
from app.policy.engine import PolicyEngine
from app.policy.policy_file import default_policy
from app.policy.signals import FaultKind, FaultSignal, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)

SUSTAIN = 120  # detection.straggler.sustain_seconds in policy.yaml


def _rollouts(rates: Mapping[int, float], *, job: str = JOB) -> Callable[[Cluster], None]:
    """Every second: rollout rank r on node n<r> reports ``rates[r]`` tokens/s (± 10 %)."""
    rng = random.Random(7)

    def f(c: Cluster) -> None:
        for rank, rate in rates.items():
            node = f"n{rank}"
            c.put(
                node,
                m.ROLLOUT_TOKENS_PER_SECOND,
                rate * rng.uniform(0.9, 1.1),
                job=job,
                role="rollout",
                rank=str(rank),
            )
            c.participant("rollout", rank, node, phase="ROLLOUT", job=job)

    return f


def _fired(results: list[list[FaultSignal]]) -> set[tuple[str | None, int | None]]:
    return {(s.subject.role, s.subject.rank) for sigs in results for s in sigs}


def test_a_slow_rollout_is_a_straggler_after_the_sustain_time_and_its_peers_are_not() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    res = c.run(SUSTAIN + 5, _rollouts({0: 1000, 1: 1100, 2: 300, 3: 950, 4: 1050}), detector=det)
    fired = first_firing(res)
    assert fired is not None and SUSTAIN <= fired <= SUSTAIN + 2, fired
    assert _fired(res) == {("rollout", 2)}
    sig = res[-1][0]
    assert sig.kind is FaultKind.STRAGGLER and sig.suggested_tier is Tier.LIGHT
    assert sig.subject.node == "n2" and sig.subject.job == JOB
    assert sig.extra["peers"] == 4
    assert 950 <= sig.extra["peer_median"] <= 1100
    assert sig.extra["figure"] < 0.5 * sig.extra["peer_median"]
    assert sig.evidence.metric == m.ROLLOUT_TOKENS_PER_SECOND
    assert "vs its peers' median" in sig.evidence.detail and "4 peers" in sig.evidence.detail


def test_a_slow_but_uniform_fleet_has_no_straggler() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    res = c.run(SUSTAIN + 60, _rollouts({r: 150 for r in range(6)}), detector=det)
    assert first_firing(res) is None


def test_a_rollout_somewhat_slower_than_its_peers_is_no_straggler() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    res = c.run(SUSTAIN + 60, _rollouts({0: 1000, 1: 1000, 2: 650, 3: 1000}), detector=det)
    assert first_firing(res) is None


def test_fewer_peers_than_the_minimum_judge_nobody_whose_spread_was_always_there() -> None:
    """Two peers: the small-group rule, which fires only for one that fell behind; rank 2 was
    never in line with its peers (its spread is its normal)."""
    c = Cluster()
    det = StragglerDetector(c.policy)
    res = c.run(SUSTAIN + 60, _rollouts({0: 1000, 1: 1000, 2: 100}), detector=det)  # 2 peers
    assert first_firing(res) is None
    res = c.run(SUSTAIN + 5, _rollouts({0: 1000, 1: 1000, 2: 100, 3: 1000}), detector=det)
    assert _fired(res) == {("rollout", 2)}  # a third peer joins: now it is judged


def test_a_dip_shorter_than_the_sustain_time_is_not_a_straggler() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    healthy = {0: 1000, 1: 1000, 2: 1000, 3: 1000}
    res = c.run(SUSTAIN - 20, _rollouts({**healthy, 2: 200}), detector=det)
    res += c.run(5, _rollouts(healthy), detector=det)
    # The clock starts over: another dip as long as the first is still too short.
    res += c.run(SUSTAIN - 20, _rollouts({**healthy, 2: 200}), detector=det)
    assert first_firing(res) is None


def test_a_stalled_rollout_is_not_a_straggler_nor_a_peer() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    # Rank 3 waits on a tool (0 tokens/s): the stall detectors' case. The three others are
    # then too few peers for rank 2 to be judged.
    res = c.run(SUSTAIN + 30, _rollouts({0: 1000, 1: 1000, 2: 200, 3: 0}), detector=det)
    assert first_firing(res) is None


def test_peers_are_the_same_job_and_role_only() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    fast, slow = _rollouts({r: 1000 for r in range(4)}), _rollouts({10: 100, 11: 110}, job="b")

    def both(cl: Cluster) -> None:
        fast(cl)
        slow(cl)

    res = c.run(SUSTAIN + 30, both, detector=det)
    assert first_firing(res) is None  # job b's two rollouts are uniform among themselves


def _trainers(step_seconds: dict[int, float]) -> Callable[[Cluster], None]:
    def f(c: Cluster) -> None:
        for rank, secs in step_seconds.items():
            c.put("n0", m.TRAIN_STEP_SECONDS, secs, job=JOB, role="trainer", rank=str(rank))
            c.participant("trainer", rank, "n0")

    return f


def test_a_trainer_rank_with_its_own_step_time_far_above_its_peers_is_a_light_straggler() -> None:
    c = Cluster()
    engine = PolicyEngine(c.policy)
    decisions = c.run(SUSTAIN + 5, _trainers({0: 3.0, 1: 3.2, 2: 2.9, 3: 7.5}), engine=engine)
    [opened] = [d for d in decisions if d.kind is FaultKind.STRAGGLER]
    assert (opened.subject.role, opened.subject.rank) == ("trainer", 3)
    assert opened.tier is Tier.LIGHT and opened.actions == ()  # no action unless the policy says
    assert opened.signal is not None and "train_step_seconds" in opened.signal.evidence.detail
    assert opened.signal.extra["peer_median"] == pytest.approx(3.0)


def _report_step(c: Cluster, rank: int, step: int) -> None:
    """What the agent sends for a trainer's heartbeat: its step as a sample and a participant."""
    c.put("n0", m.TRAIN_STEP, step, job=JOB, role="trainer", rank=str(rank))
    c.participant("trainer", rank, "n0", step=step)


def test_trainers_in_lock_step_are_no_stragglers_and_a_rank_stepping_slower_is() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    steps = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}

    def stepping(rates: dict[int, float]) -> Callable[[Cluster], None]:
        def f(cl: Cluster) -> None:
            for rank, per_second in rates.items():
                steps[rank] += per_second
                _report_step(cl, rank, int(steps[rank]))

        return f

    res = c.run(SUSTAIN + 60, stepping({r: 1 / 3 for r in range(4)}), detector=det)
    assert first_firing(res) is None
    # Rank 1 now takes 9 s a step: the median of its last 5 step times shows it after 3 of
    # them (27 s), and the sustain time runs from then.
    res = c.run(45 + SUSTAIN + 10, stepping({0: 1 / 3, 1: 1 / 9, 2: 1 / 3, 3: 1 / 3}), detector=det)
    assert _fired(res) == {("trainer", 1)}
    sig = res[-1][0]
    assert "its pace" in sig.evidence.detail and sig.extra["figure"] == pytest.approx(9, abs=0.5)


def test_a_restarted_trainer_starts_its_pace_over() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    steps = dict.fromkeys(range(4), 30.0)

    def f(cl: Cluster) -> None:
        for rank in range(4):
            steps[rank] += 1 / 3
            _report_step(cl, rank, int(steps[rank]))

    c.run(60, f, detector=det)
    steps[2] = 0.0  # rank 2 restored from an older checkpoint: its step went back
    res = c.run(SUSTAIN + 30, f, detector=det)
    assert first_firing(res) is None


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
def test_median_without_one_element_matches_the_definition(n: int) -> None:
    rng = random.Random(n)
    values = sorted(rng.uniform(0, 100) for _ in range(n))
    for order in (values, values[::-1]):
        for i in range(n):
            assert _median_without(order, i) == pytest.approx(
                statistics.median(order[:i] + order[i + 1 :])
            )


def test_the_policy_keys_are_validated() -> None:
    from app.policy.policy_file import PolicyFileError, parse_policy

    data = default_policy().model_dump(mode="json")
    data["detection"]["straggler"]["throughput_ratio"] = 1.5
    with pytest.raises(PolicyFileError, match=r"detection\.straggler\.throughput_ratio"):
        parse_policy(data)


def test_a_trainer_whose_step_stopped_is_no_peer() -> None:
    c = Cluster()
    det = StragglerDetector(c.policy)
    steps = dict.fromkeys(range(4), 0.0)
    rates = dict.fromkeys(range(4), 1 / 3)

    def f(cl: Cluster) -> None:
        for rank, rate in rates.items():
            steps[rank] += rate
            _report_step(cl, rank, int(steps[rank]))

    c.run(60, f, detector=det)
    rates[3] = 0.0  # rank 3 hangs (train_hang's case): its last pace is no figure any more
    rates[1] = 1 / 9  # rank 1 slows down: 2 live peers left, a small group: its rule judges
    res = c.run(SUSTAIN + 60, f, detector=det)
    assert _fired(res) == {("trainer", 1)}
    assert all(s.extra.get("small_group") and s.extra["peers"] == 2 for sigs in res for s in sigs)
    rates[3] = 1 / 3  # rank 3 steps again: once paced, a third peer
    res = c.run(30 + SUSTAIN, f, detector=det)
    assert _fired(res) == {("trainer", 1)}
