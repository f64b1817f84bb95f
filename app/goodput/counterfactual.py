"""The same faults under the common alternative: a person notices, the whole job restarts from
its newest checkpoint. What RLGuard saved is the difference, so the assumptions travel with the
answer (:class:`Assumptions`).

Per fault, the whole-job restart loses the partial step the fault interrupted (last new step →
fault), ``human_detection_seconds`` until a person notices, the job's own start-up time
(measured from its first start: first report → first new step, less one typical step), and every
step since the newest checkpoint at the fault, at the typical step time. Overlapping spans are
merged like the real ones.

A class of fault (``counterfactual.classes`` in policy.yaml, each figure with its published
source) may have its own detection and restart times; :func:`class_costs` turns the policy's
classes into a kind -> figures map, and the ledger shows each class it used next to the saved
figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.goodput.breakdown import IncidentCost
from app.goodput.intervals import Interval
from app.goodput.steps import StepHistory


@dataclass(slots=True, frozen=True)
class Counterfactual:
    incident_id: int
    lost: Interval
    steps_redone: int


@dataclass(slots=True, frozen=True)
class ClassCost:
    """A class of faults' own figures (None: the ledger's default for that figure)."""

    name: str
    detection_seconds: float | None
    restart_seconds: float | None
    source: str

    def describe(self) -> str:
        parts = []
        if self.detection_seconds is not None:
            parts.append(f"detected after {self.detection_seconds:g} s")
        if self.restart_seconds is not None:
            parts.append(f"restart {self.restart_seconds:g} s")
        return f"{self.name}: {', '.join(parts) or 'defaults'} ({self.source})"


def class_costs(classes: Mapping[str, object]) -> dict[str, ClassCost]:
    """kind -> its class's figures, from the policy's ``counterfactual.classes`` (objects
    with ``kinds``, ``detection_seconds``, ``restart_seconds`` and ``source``)."""
    out: dict[str, ClassCost] = {}
    for name, cls in classes.items():
        cost = ClassCost(
            name,
            getattr(cls, "detection_seconds", None),
            getattr(cls, "restart_seconds", None),
            str(getattr(cls, "source", "")),
        )
        for kind in getattr(cls, "kinds", ()):
            out[str(getattr(kind, "value", kind))] = cost
    return out


def startup_seconds(
    history: StepHistory, *, started_at: float, typical_step: float | None
) -> float | None:
    """First report → first new step, less one typical step; None when not seen."""
    if not history.completions:
        return None
    first = history.completions[0]
    if first.at < started_at:
        return None
    return max(0.0, first.at - started_at - (typical_step or 0.0) * first.new)


def whole_job_restart(
    cost: IncidentCost,
    *,
    checkpoint_step: int | None,
    mark: int | None,
    human_detection_seconds: float,
    startup: float,
    typical_step: float | None,
) -> Counterfactual:
    """The span ``cost``'s fault would have cost under a whole-job restart."""
    redone = max(0, (mark or 0) - checkpoint_step) if checkpoint_step is not None else 0
    start = cost.lost.start
    seconds = (
        (cost.fault_at - start) + human_detection_seconds + startup + redone * (typical_step or 0.0)
    )
    return Counterfactual(cost.id, Interval(start, start + seconds), redone)


def assumed_checkpoint(mark: int | None, every_steps: int) -> int | None:
    """The newest checkpoint at step ``mark`` when checkpoints are every ``every_steps`` steps."""
    if mark is None:
        return None
    return mark - mark % every_steps


def newest_checkpoint(points: Sequence[tuple[float, int]], at: float) -> int | None:
    """The newest committed checkpoint step reported at or before ``at``."""
    found = None
    for t, step in sorted(points):
        if t > at:
            break
        found = step if found is None else max(found, step)
    return found
