"""A job's goodput over a window: ETTR, GPU-hours lost, the incidents' costs and the
counterfactual, assembled from plain data (``app.goodput.queries`` gathers it).

ETTR (effective training time ratio) = productive time / wall time, where wall time is the part
of the window the job existed (first report → last report) and productive time is wall time
less the union of the incidents' lost spans: two incidents that overlap cost their overlap once.
A job with no fault has ETTR 1.0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from app.goodput.breakdown import (
    SEGMENTS,
    IncidentCost,
    IncidentFacts,
    disturbed_intervals,
    incident_cost,
)
from app.goodput.counterfactual import (
    ClassCost,
    assumed_checkpoint,
    newest_checkpoint,
    startup_seconds,
    whole_job_restart,
)
from app.goodput.intervals import Interval, clip_all, measure, overlap, union
from app.goodput.public import (
    AssumptionsPublic,
    ClassAssumptionPublic,
    CounterfactualPublic,
    EttrPoint,
    IncidentGoodput,
    JobGoodput,
)
from app.goodput.steps import StepHistory, StepPoint

#: Bucket sizes for "ETTR over time", the first that gives at most ``MAX_BUCKETS``.
BUCKET_SECONDS = (60, 300, 900, 3600, 6 * 3600, 86400)
MAX_BUCKETS = 48


@dataclass(slots=True, frozen=True)
class LedgerInput:
    job: str
    since: float
    until: float
    #: the job's first and last report (epoch seconds)
    first_seen: float
    last_seen: float
    steps: Sequence[StepPoint]
    incidents: Sequence[IncidentFacts]
    #: (at, step) of committed checkpoints the job reported
    checkpoints: Sequence[tuple[float, int]]
    gpu_count: int
    gpu_count_source: str
    price_per_gpu_hour: float
    human_detection_seconds: float
    checkpoint_every_steps: int
    #: kind -> its class's own counterfactual figures (policy counterfactual.classes)
    class_costs: Mapping[str, ClassCost] = field(default_factory=dict)


def _iso(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def build_ledger(data: LedgerInput) -> JobGoodput:
    active = Interval(max(data.since, data.first_seen), min(data.until, data.last_seen))
    history = StepHistory(data.steps)
    typical = history.typical_step_seconds(disturbed_intervals(data.incidents, end=data.until))
    costs = sorted(
        (incident_cost(f, history, typical_step=typical, end=data.until) for f in data.incidents),
        key=lambda c: (c.lost.start, c.id),
    )
    startup = startup_seconds(history, started_at=data.first_seen, typical_step=typical)
    ckpt_source = (
        "reported" if data.checkpoints else f"assumed every {data.checkpoint_every_steps} steps"
    )
    rows, lost_spans, cf_spans, used = _in_window(data, costs, history, active, typical, startup)
    wall = active.seconds
    lost = measure(clip_all(lost_spans, active.start, active.end))
    productive = wall - lost
    # The counterfactual job would have run longer: its lost time is not clipped at the end.
    cf_lost = measure(clip_all(cf_spans, active.start, float("inf"))) if wall > 0 else 0.0
    gpus = data.gpu_count
    return JobGoodput(
        job=data.job,
        since=_iso(data.since),
        until=_iso(data.until),
        wall_seconds=wall,
        productive_seconds=productive,
        lost_seconds=lost,
        ettr=_ratio(productive, wall),
        gpu_count=gpus,
        gpu_hours_lost=lost / 3600.0 * gpus,
        cost_lost=lost / 3600.0 * gpus * data.price_per_gpu_hour,
        segments={name: sum(r.segments[name] for r in rows) for name in SEGMENTS},
        incidents=rows,
        series=_series(active, lost_spans),
        counterfactual=CounterfactualPublic(
            lost_seconds=cf_lost,
            ettr=_ratio(productive, productive + cf_lost),
            gpu_hours_lost=cf_lost / 3600.0 * gpus,
            gpu_hours_saved=(cf_lost - lost) / 3600.0 * gpus,
            money_saved=(cf_lost - lost) / 3600.0 * gpus * data.price_per_gpu_hour,
            assumptions=AssumptionsPublic(
                human_detection_seconds=data.human_detection_seconds,
                startup_seconds=startup or 0.0,
                startup_source="measured" if startup is not None else "unknown",
                typical_step_seconds=typical,
                price_per_gpu_hour=data.price_per_gpu_hour,
                gpu_count=gpus,
                gpu_count_source=data.gpu_count_source,
                checkpoint_source=ckpt_source,
                classes=[
                    ClassAssumptionPublic(
                        name=c.name,
                        kinds=sorted(k for k, v in data.class_costs.items() if v == c),
                        detection_seconds=c.detection_seconds,
                        restart_seconds=c.restart_seconds,
                        source=c.source,
                    )
                    for c in used
                ],
                summary=_summary(data, startup, used),
            ),
        ),
    )


def _in_window(
    data: LedgerInput,
    costs: Sequence[IncidentCost],
    history: StepHistory,
    active: Interval,
    typical: float | None,
    startup: float | None,
) -> tuple[list[IncidentGoodput], list[Interval], list[Interval], list[ClassCost]]:
    """The incidents whose cost or fault falls in the window: their rows (each with the part
    no earlier incident already counted), lost spans, counterfactual spans, and the classes
    whose own figures their counterfactual used."""
    rows: list[IncidentGoodput] = []
    lost_spans: list[Interval] = []
    cf_spans: list[Interval] = []
    counted_so_far: list[Interval] = []
    used: list[ClassCost] = []
    for cost in costs:
        mine = clip_all([cost.lost], active.start, active.end)
        if not mine and not data.since <= cost.fault_at < data.until:
            continue
        mark = history.mark_at(cost.fault_at)
        ckpt = (
            newest_checkpoint(data.checkpoints, cost.fault_at)
            if data.checkpoints
            else assumed_checkpoint(mark, data.checkpoint_every_steps)
        )
        cls = data.class_costs.get(cost.kind)
        if cls is not None and cls not in used:
            used.append(cls)
        detection = data.human_detection_seconds
        restart = startup or 0.0
        if cls is not None:
            detection = detection if cls.detection_seconds is None else cls.detection_seconds
            restart = restart if cls.restart_seconds is None else cls.restart_seconds
        cf = whole_job_restart(
            cost,
            checkpoint_step=ckpt,
            mark=mark,
            human_detection_seconds=detection,
            startup=restart,
            typical_step=typical,
        )
        if cost.drill:  # a rehearsal: its own cost is shown, the job's figures leave it out
            rows.append(_incident_row(cost, 0.0, cf.lost.seconds, cf.steps_redone))
            continue
        counted = measure(mine) - overlap(mine, counted_so_far)
        counted_so_far = union([*counted_so_far, *mine])
        lost_spans.append(cost.lost)
        cf_spans.append(cf.lost)
        rows.append(_incident_row(cost, counted, cf.lost.seconds, cf.steps_redone))
    return rows, lost_spans, cf_spans, used


def _summary(data: LedgerInput, startup: float | None, used: Sequence[ClassCost]) -> str:
    """One line of what the saved figures assume, for beside them."""
    base = (
        f"a person notices after {data.human_detection_seconds:g} s and the job restarts in "
        f"{'its measured ' + format(startup, '.0f') + ' s' if startup is not None else 'an unknown time'}"
    )
    if not used:
        return base
    return base + "; " + "; ".join(c.describe() for c in used)


def _ratio(num: float, den: float) -> float:
    return 1.0 if den <= 0 else max(0.0, min(1.0, num / den))


def _incident_row(
    cost: IncidentCost, counted: float, cf_seconds: float, cf_redone: int
) -> IncidentGoodput:
    return IncidentGoodput(
        id=cost.id,
        kind=cost.kind,
        tier=cost.tier,
        fault_at=_iso(cost.fault_at),
        detected_at=_iso(cost.detected_at),
        recovered_at=None if cost.recovered_at is None else _iso(cost.recovered_at),
        resumed_at=None if cost.resumed_at is None else _iso(cost.resumed_at),
        lost_seconds=cost.lost_seconds,
        counted_seconds=counted,
        segments=dict(cost.segments),
        steps_redone=cost.steps_redone,
        ongoing=cost.ongoing,
        whole_job_restart_seconds=cf_seconds,
        whole_job_restart_steps_redone=cf_redone,
        drill=cost.drill,
    )


def _series(active: Interval, lost_spans: Sequence[Interval]) -> list[EttrPoint]:
    if active.seconds <= 0:
        return []
    size = next(
        (b for b in BUCKET_SECONDS if active.seconds / b <= MAX_BUCKETS), BUCKET_SECONDS[-1]
    )
    out = []
    t = active.start
    while t < active.end:
        hi = min(t + size, active.end)
        lost = measure(clip_all(lost_spans, t, hi))
        out.append(EttrPoint(start=_iso(t), end=_iso(hi), ettr=_ratio(hi - t - lost, hi - t)))
        t = hi
    return out
