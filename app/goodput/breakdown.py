"""One incident's cost: the productive time it took from the job, and where that time went.

Read along the time axis of one incident:

    last new step ─ fault ─ detected ─(waiting for approval)─ recovered ─ first new step
       └ redo ┘    └ detect ┘ └────── recover / approve ──────┘ └──── redo ────┘

* **lost**: from the last new step before the fault to the first *new* step after the recovery
  (above the high-water mark: steps trained again and rollouts regenerated are redone work). New
  steps the job still completed inside that span are credited back at its typical step time.
* **detect**: fault start (``opened_at`` − the detector's ``detection_delay_seconds``) →
  incident opened; **approve**: time waiting for an approver inside detection → recovery;
  **recover**: the rest of detection → recovery (the last of its actions to succeed); **redo**:
  both ends of the span outside those.

Everything here is pure: plain data in, plain data out (``app.goodput.queries`` reads the
database).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.goodput.intervals import Interval, clip_all, measure, subtract
from app.goodput.steps import StepHistory

SEGMENTS = ("detect", "approve", "recover", "redo")


@dataclass(slots=True, frozen=True)
class IncidentFacts:
    """What the server recorded about one incident of the job (epoch seconds)."""

    id: int
    kind: str
    tier: str
    fault_at: float
    detected_at: float
    #: when the last of its recovery actions succeeded; None: none succeeded (yet)
    recovered_at: float | None
    resolved_at: float | None
    #: approval waits, open-ended ones already closed at the ledger's end by the reader
    approval_waits: tuple[Interval, ...] = ()
    #: a fault injected on purpose (rlguard drill): shown, never counted in the ETTR
    drill: bool = False


@dataclass(slots=True)
class IncidentCost:
    id: int
    kind: str
    tier: str
    fault_at: float
    detected_at: float
    recovered_at: float | None
    #: the first new step after the recovery; None: not yet (``ongoing``)
    resumed_at: float | None
    #: [last new step before the fault, end of the lost time)
    lost: Interval
    segments: dict[str, float] = field(default_factory=dict)
    steps_redone: int = 0
    ongoing: bool = False
    drill: bool = False

    @property
    def lost_seconds(self) -> float:
        return self.lost.seconds


def incident_cost(
    facts: IncidentFacts, history: StepHistory, *, typical_step: float | None, end: float
) -> IncidentCost:
    """The cost of ``facts`` given the job's step history; ``end`` closes an ongoing one."""
    fault = min(facts.fault_at, facts.detected_at)
    detected = facts.detected_at
    if history.completions:
        last = history.last_completion_at(fault)
        start = last if last is not None else min(fault, history.first_at or fault)
        reference = facts.recovered_at if facts.recovered_at is not None else detected
        resumed = history.first_completion_after(max(reference, fault))
        resumed_at = resumed.at if resumed is not None and resumed.at <= end else None
        span_end = resumed_at if resumed_at is not None else max(end, start)
        credit = (typical_step or 0.0) * history.new_steps_between(start, span_end)
    else:
        # No progress recorded (no trainer role reports, or no step completed yet): the
        # incident costs fault -> recovery (else its resolution), with nothing to credit.
        start = fault
        done = facts.recovered_at if facts.recovered_at is not None else facts.resolved_at
        resumed_at = done if done is not None and done <= end else None
        span_end = resumed_at if resumed_at is not None else max(end, start)
        credit = 0.0
    lost = Interval(start, max(start, span_end - credit))

    recovered = facts.recovered_at if facts.recovered_at is not None else span_end
    recovered = max(recovered, detected)
    waits = clip_all(facts.approval_waits, detected, recovered)
    pieces: dict[str, list[Interval]] = {
        "detect": [Interval(fault, detected)],
        "approve": waits,
        "recover": subtract(Interval(detected, recovered), waits),
        "redo": [Interval(start, fault), Interval(recovered, max(recovered, span_end))],
    }
    segments = {name: measure(clip_all(ivs, lost.start, lost.end)) for name, ivs in pieces.items()}
    mark = history.mark_at(fault)
    lowest = history.lowest_step_between(fault, span_end)
    redone = max(0, mark - lowest) if mark is not None and lowest is not None else 0
    return IncidentCost(
        id=facts.id,
        kind=facts.kind,
        tier=facts.tier,
        fault_at=fault,
        detected_at=detected,
        recovered_at=facts.recovered_at,
        resumed_at=resumed_at,
        lost=lost,
        segments=segments,
        steps_redone=redone,
        ongoing=resumed_at is None,
        drill=facts.drill,
    )


def disturbed_intervals(facts: Sequence[IncidentFacts], *, end: float) -> list[Interval]:
    """Each incident's fault → recovery (or its resolution, or ``end``): gaps a typical step must not come from."""
    return [
        Interval(
            min(f.fault_at, f.detected_at),
            max(_first_known(f.recovered_at, f.resolved_at, end), f.detected_at),
        )
        for f in facts
    ]


def _first_known(*values: float | None) -> float:
    return next(v for v in values if v is not None)
