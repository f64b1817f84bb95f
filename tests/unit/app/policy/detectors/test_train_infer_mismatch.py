"""Train/inference disagreement per engine: an engine that jumps against its peers and its own
history fires (stale weights after a failed refit); a fleet that disagrees uniformly (bf16
engines against an fp32 trainer), a noisy healthy run and a stale figure do not."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from app.policy.detectors.train_infer_mismatch import TrainInferMismatchDetector
from app.policy.signals import FaultKind, FaultSignal, Tier
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster, first_firing

pytestmark = pytest.mark.timeout(30)

STEP_S = 3  # a new figure per engine every step; the heartbeat repeats it every second


def _engines(level: Callable[[int, int], float], ranks: int = 2) -> Callable[[Cluster], None]:
    """Every second: engine r reports ``level(step, r)`` (a new value per step, ± 20 %)."""
    rng = random.Random(3)
    current: dict[int, tuple[int, float]] = {}

    def f(c: Cluster) -> None:
        step = int(c.now) // STEP_S
        for r in range(ranks):
            if current.get(r, (-1, 0.0))[0] != step:
                current[r] = (step, level(step, r) * rng.uniform(0.8, 1.2))
            c.put(
                f"n{r}",
                m.ROLLOUT_LOGPROB_DIFF_MEAN,
                current[r][1],
                job=JOB,
                role="rollout",
                rank=str(r),
            )

    return f


def _fired(results: list[list[FaultSignal]]) -> set[tuple[str | None, int | None]]:
    return {(s.subject.role, s.subject.rank) for sigs in results for s in sigs}


def _run(
    seconds: int, level: Callable[[int, int], float], ranks: int = 2
) -> list[list[FaultSignal]]:
    c = Cluster()
    det = TrainInferMismatchDetector(c.policy)
    return c.run(seconds, _engines(level, ranks), detector=det)


def test_an_engine_serving_the_previous_weights_is_caught_within_two_steps() -> None:
    start = 20  # steps of healthy history first

    def level(step: int, rank: int) -> float:
        return 0.4 if rank == 1 and step >= start else 1e-7

    res = _run((start + 3) * STEP_S, level)
    first = first_firing(res)
    assert first is not None and first <= (start + 2) * STEP_S, first
    assert _fired(res) == {("rollout", 1)}
    sig = next(s for sigs in res for s in sigs)
    assert sig.kind is FaultKind.TRAIN_INFER_MISMATCH and sig.suggested_tier is Tier.MEDIUM
    assert "peers' median" in sig.evidence.detail


def test_a_healthy_run_never_fires() -> None:
    assert _fired(_run(200, lambda step, rank: 1e-7)) == set()


def test_a_fleet_that_disagrees_uniformly_is_not_a_fault() -> None:
    # bf16 engines against an fp32 trainer: every engine near 0.1 nats, with step-to-step noise
    assert _fired(_run(200, lambda step, rank: 0.1, ranks=3)) == set()


def test_one_engine_is_judged_on_its_own_history() -> None:
    res = _run(40 * STEP_S, lambda step, rank: 0.5 if step >= 30 else 1e-6, ranks=1)
    assert _fired(res) == {("rollout", 0)}


def test_a_figure_older_than_the_window_is_not_judged() -> None:
    c = Cluster()
    det = TrainInferMismatchDetector(c.policy)
    c.put("n0", m.ROLLOUT_LOGPROB_DIFF_MEAN, 1e-7, job=JOB, role="rollout", rank="0")
    c.put("n1", m.ROLLOUT_LOGPROB_DIFF_MEAN, 0.9, job=JOB, role="rollout", rank="1")
    max_age = c.policy.detection.train_infer.max_age_seconds
    res = c.run(int(max_age) + 5, lambda _c: None, detector=det)
    assert res[0] and not res[-1]  # judged while fresh, then no more
