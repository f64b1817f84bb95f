"""Training and inference disagree: an engine whose sampled tokens the trainer scores very
differently from the engine itself (``train_infer_mismatch``; medium, plan ``restart_role``:
the job's hook quarantines the engine, replaces it and refits it before it serves again).

The job sends, per rollout engine and step, the mean |trainer logprob - engine logprob| over
the tokens that engine sampled (``rollout_logprob_diff_mean``, a heartbeat signal of the
engine's host: ``workload/engines/``; TRL logs the same idea as
``sampling/importance_sampling_ratio/*``, verl as ``rollout_probs_diff_*``). No anchor alerts on
it, yet it is the mark of an engine serving other weights than the trainer's (a refit that
failed silently), of a precision or kernel mismatch, or of a corrupted engine.

An engine is judged against its peers and its own history, never an absolute bar alone: some
disagreement is normal (bf16 engines against an fp32 trainer sit near 1e-2 nats; an fp32 CPU
engine near 1e-7), and it is the same for every engine of a job. The engine's newest figure
(at most ``max_age_seconds`` old) must be above ``min_diff`` and above ``peer_ratio`` x the
median of its peers' newest figures (the other engines of the job) and ``history_ratio`` x the
median of its own earlier figures, where it has either. A job with one engine and no history
is judged on ``min_diff`` alone: nothing else to compare with.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from app.policy.detectors.base import Detector, subject_of
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import World
from app.series.store import SeriesKey
from recovery.protocol import metric_names as m


class TrainInferMismatchDetector(Detector):
    """See the module docstring."""

    lookups = (m.ROLLOUT_LOGPROB_DIFF_MEAN,)

    def detect(self, world: World) -> list[FaultSignal]:
        rules = self.policy.detection.train_infer
        fresh: dict[str, list[tuple[SeriesKey, Sequence[tuple[float, float]]]]] = defaultdict(list)
        for key, ring in world.rings(m.ROLLOUT_LOGPROB_DIFF_MEAN):
            if ring and world.now - ring[-1][0] <= rules.max_age_seconds:
                fresh[key.label(m.LABEL_JOB) or ""].append((key, ring))
        out = []
        for engines in fresh.values():
            for key, ring in engines:
                ts, value = ring[-1]
                if value < rules.min_diff:
                    continue
                peers = [r[-1][1] for k, r in engines if k != key]
                # Its figures of earlier steps (a heartbeat repeats the newest until the next step).
                history = [v for _t, v in ring if v != value]
                bar = rules.min_diff
                if peers:
                    bar = max(bar, rules.peer_ratio * statistics.median(peers))
                if history:
                    bar = max(bar, rules.history_ratio * statistics.median(history))
                if value < bar:
                    continue
                since = self.sticky_since(key, ts, open_ended=True)
                out.append(
                    FaultSignal(
                        kind=FaultKind.TRAIN_INFER_MISMATCH,
                        subject=subject_of(key),
                        evidence=Evidence(
                            metric=m.ROLLOUT_LOGPROB_DIFF_MEAN,
                            values=cap_points([(t, v) for t, v in ring]),
                            window_seconds=rules.max_age_seconds,
                            threshold=bar,
                            detail=(
                                f"mean |trainer - engine| logprob {value:.3g} nats against a bar "
                                f"of {bar:.3g} (min {rules.min_diff:g}; peers' median "
                                f"{_fmt(peers)} x {rules.peer_ratio:g}; own history's median "
                                f"{_fmt(history)} x {rules.history_ratio:g})"
                            ),
                        ),
                        suggested_tier=self.tier(FaultKind.TRAIN_INFER_MISMATCH),
                        detected_at=world.now,
                        since=since,
                    )
                )
        return out


def _fmt(values: list[float]) -> str:
    return "-" if not values else f"{statistics.median(values):.3g}"
