"""Golden metrics judged from the breach runs ingest keeps (``BreachRun``, a standing question
to the store) answer as a full re-read every tick would.

The reference, ``FullReread``, is the detector as it was before: every series above healthy and
fresh has its look-back window re-read (``_judge``) on every tick. Randomized sequences of
appends, backfilled (out-of-order) samples, series dropped and recreated, buffer trimming and
gaps in time are fed to both, tick by tick; their signals must be identical.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.policy.detectors import GoldenMetricDetector
from app.policy.engine import _build_index
from app.policy.policy_file import default_policy
from app.policy.signals import FaultSignal
from app.policy.world import World
from app.series.store import SeriesKey, SeriesStore
from recovery.protocol import metric_names as m

from .._helpers import JOB, T0

pytestmark = pytest.mark.timeout(120)

POLICY = default_policy()
STALE = POLICY.detection.stale_sample_seconds
# Per metric, values on and around its healthy and warning levels (GoldenMetricRule).
VALUES = {
    m.ROLLOUT_PENDING_RATIO: (0.05, 0.1, 0.2, 0.3, 0.31, 0.6),
    m.ACTOR_SHARD_REBUILD_COUNT_5M: (0.0, 0.05, 1.0, 2.0, 3.0),
    m.STATE_LOG_WRITE_LATENCY_MS: (10.0, 50.0, 120.0, 200.0, 250.0),
}
NAMES = tuple(VALUES)
KEYS = [
    SeriesKey.of(node, name, {"job": JOB, "role": "rollout", "rank": str(r)})
    for name in NAMES
    for node, r in (("n0", 0), ("n1", 1))
]
# The randomized sequences use one series per metric plus a second latency series, so that a
# series sees several samples between two ticks often.
RANDOM_KEYS = KEYS[::2] + KEYS[5:]


class FullReread(GoldenMetricDetector):
    """The detector without breach runs: every candidate's window re-read each tick."""

    def detect(self, world: World) -> list[FaultSignal]:
        hold = self.policy.incidents.quiet_period_seconds
        self._fired = {k: v for k, v in self._fired.items() if world.now - v[1] <= hold}
        out: list[FaultSignal] = []
        for name, rule in self.policy.golden_metrics.items():
            for key, points in world.rings(name):
                ts, value = points[-1]
                if value > rule.healthy and world.now - ts <= STALE:
                    sig = self._judge(world, key, rule)
                    if sig is not None:
                        out.append(sig)
        return out


class Pair:
    """The incremental detector and the reference over one store, ticked together."""

    def __init__(self, store: SeriesStore, start: float = T0) -> None:
        self.store = store
        self.now = start
        self.inc = GoldenMetricDetector(POLICY)
        self.ref = FullReread(POLICY)
        self.index = _build_index([self.inc])

    def put(self, key: SeriesKey, value: float, lag: float = 0.0) -> None:
        self.store.append(key, self.now - lag, value)

    def tick(self) -> list[FaultSignal]:
        world = World(now=self.now, store=self.store)
        world.index_latest((), self.index)
        got = self.inc.run(world)
        want = self.ref.run(world)
        assert got == want, f"at +{self.now - T0:g}s: incremental {got} != full re-read {want}"
        return got


_op = st.one_of(
    # a new sample (lag 0) or a backfilled one (lag > 0: inserted before the newest)
    st.tuples(
        st.just("put"),
        st.integers(0, len(RANDOM_KEYS) - 1),
        st.integers(0, 5),
        st.sampled_from([0.0, 0.0, 0.0, 0.5, 1.0, 3.0, 8.0, 14.0, 14.9]),
    ),
    # two new samples of one series between two ticks (the first may cross warning)
    st.tuples(
        st.just("burst"), st.integers(0, len(RANDOM_KEYS) - 1), st.integers(0, 35), st.just(0.0)
    ),
    # series silent for longer than the stale time are dropped (recreated by their next sample)
    st.tuples(st.just("drop"), st.just(0), st.just(0), st.just(0.0)),
)
# Steps that are not binary fractions: the boundaries (stale, look-back) are met to the last bit.
_tick = st.tuples(
    st.sampled_from([0.1, 0.3, 0.5, 1.0, 1.0, 2.0, 7.0, 20.0, 40.0]), st.lists(_op, max_size=8)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Always run, whatever the draw: in band, then a breach and a return into band between two
# ticks (shard: 1, then 2 and 1), and in band, then a breach backfilled behind the newest sample.
@example(
    window=900.0,
    max_points=1200,
    ticks=[(1.0, [("put", 1, 2, 0.0)]), (1.0, [("burst", 1, 20, 0.0)])],
)
@example(
    window=900.0,
    max_points=8,
    ticks=[(1.0, [("put", 1, 2, 0.0)]), (1.0, [("put", 1, 2, 0.0), ("put", 1, 3, 0.5)])],
)
@given(
    window=st.sampled_from([30.0, 900.0]),
    max_points=st.sampled_from([3, 8, 1200]),
    ticks=st.lists(_tick, min_size=1, max_size=40),
)
def test_incremental_judgement_equals_a_full_reread(
    window: float, max_points: int, ticks: list[tuple[float, list[tuple[str, int, int, float]]]]
) -> None:
    pair = Pair(SeriesStore(window_seconds=window, max_points=max_points), start=T0 + 0.1)
    for dt, ops in ticks:
        pair.now += dt
        for kind, k, v, lag in ops:
            key = RANDOM_KEYS[k]
            values = VALUES[key.name]
            if kind == "drop":
                pair.store.drop_older_than(pair.now - STALE - 1)
            elif kind == "burst":
                pair.put(key, values[v // 6 % len(values)])
                pair.put(key, values[v % 6 % len(values)])
            else:
                pair.put(key, values[v % len(values)], lag)
        pair.tick()


# -- the cases an incremental judgement gets wrong most easily, spelled out ---------------------

SHARD = KEYS[2]  # actor_shard_rebuild_count_5m: healthy 0, warning 2 (inclusive), no duration
LATENCY = KEYS[4]  # state_log_write_latency_ms: healthy 50, warning 200, 10 s


def _steady(pair: Pair, key: SeriesKey, value: float, seconds: int) -> list[list[FaultSignal]]:
    out = []
    for _ in range(seconds):
        pair.now += 1
        pair.put(key, value)
        out.append(pair.tick())
    return out


def test_a_backfilled_breaching_sample_behind_the_newest_fires() -> None:
    pair = Pair(SeriesStore())
    assert not any(_steady(pair, SHARD, 1.0, 5))  # between healthy and warning
    pair.put(SHARD, 2.0, lag=1.5)  # lands before the newest sample, which stays in place
    sigs = pair.tick()
    assert len(sigs) == 1 and sigs[0].since == pair.now - 1.5


def test_a_backfilled_healthy_sample_ends_the_breach_before_it_fires() -> None:
    pair = Pair(SeriesStore())
    _steady(pair, LATENCY, 300.0, 2)
    assert not any(_steady(pair, LATENCY, 120.0, 4))  # hysteresis: still one breach
    pair.put(LATENCY, 10.0, lag=3.5)  # healthy, after the breaching samples
    assert not any(_steady(pair, LATENCY, 120.0, 12))  # without it: fires at 10 s


def test_a_breach_between_two_ticks_is_not_missed() -> None:
    pair = Pair(SeriesStore())
    _steady(pair, LATENCY, 120.0, 3)
    pair.now += 1
    pair.put(LATENCY, 300.0, lag=0.5)  # crosses warning, then back in band before the tick
    pair.put(LATENCY, 120.0)
    assert pair.tick() == []
    res = _steady(pair, LATENCY, 120.0, 12)
    fired = next(i for i, r in enumerate(res) if r)
    assert res[fired][0].since == T0 + 3.5 and all(res[fired:])


def test_a_series_back_to_healthy_is_not_judged_on_its_old_breach() -> None:
    pair = Pair(SeriesStore())
    assert any(_steady(pair, SHARD, 2.0, 2))
    _steady(pair, SHARD, 0.0, 1)  # healthy: the run is over
    res = _steady(pair, SHARD, 1.0, 40)  # in band: continued only within the minimum hold
    assert res[-1] == [] and not any(res[-5:])


def test_a_series_dropped_and_recreated_is_read_again() -> None:
    pair = Pair(SeriesStore())
    _steady(pair, SHARD, 1.0, 3)
    _steady(pair, LATENCY, 120.0, 3)
    pair.now += STALE + 5  # the shard series goes silent and is forgotten
    pair.store.drop_older_than(pair.now - STALE)
    pair.put(SHARD, 3.0)  # a new buffer, same key
    sigs = pair.tick()
    assert [s.evidence.values for s in sigs] == [((pair.now, 3.0),)]
