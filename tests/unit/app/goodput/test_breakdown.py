"""One incident's cost along its time axis, to the second."""

from __future__ import annotations

from app.goodput.breakdown import IncidentFacts, incident_cost
from app.goodput.intervals import Interval
from app.goodput.steps import StepHistory, StepPoint


def _steady(until: float, *, every: float = 10.0, start: float = 0.0) -> list[StepPoint]:
    return [StepPoint(start + i * every, i) for i in range(int((until - start) // every) + 1)]


def test_a_kill_restored_from_an_older_checkpoint() -> None:
    # Steps every 10 s up to step 10 at t=100; killed at 104; detected 110; restart done 130;
    # restored to step 8 (two steps redone: 9 at 140, 10 at 150), new step 11 at 160.
    points = _steady(100) + [
        StepPoint(130, 8),
        StepPoint(140, 9),
        StepPoint(150, 10),
        StepPoint(160, 11),
    ]
    h = StepHistory(points)
    assert h.typical_step_seconds([Interval(104, 130)]) == 10.0
    facts = IncidentFacts(
        id=1,
        kind="heartbeat_lost",
        tier="medium",
        fault_at=104,
        detected_at=110,
        recovered_at=130,
        resolved_at=200,
    )
    cost = incident_cost(facts, h, typical_step=10.0, end=1000)
    assert cost.resumed_at == 160
    # lost: last new step (100) -> first new step (160), less the new step's own 10 s.
    assert cost.lost == Interval(100, 150)
    assert cost.segments == {"detect": 6, "approve": 0, "recover": 20, "redo": 24}
    assert cost.steps_redone == 2 and not cost.ongoing


def test_an_approval_wait_is_carved_out_of_recovery() -> None:
    points = _steady(100) + [StepPoint(400, 11)]
    facts = IncidentFacts(
        id=2,
        kind="storage_unwritable",
        tier="heavy",
        fault_at=105,
        detected_at=105,
        recovered_at=395,
        resolved_at=396,
        approval_waits=(Interval(105, 300),),
    )
    cost = incident_cost(facts, StepHistory(points), typical_step=10.0, end=1000)
    assert cost.lost == Interval(100, 390)
    assert cost.segments == {"detect": 0, "approve": 195, "recover": 90, "redo": 5}


def test_ongoing_incident_runs_to_the_end_and_a_fault_that_only_slowed_is_credited() -> None:
    h = StepHistory(_steady(100))
    open_ = IncidentFacts(
        id=3,
        kind="hang",
        tier="medium",
        fault_at=103,
        detected_at=120,
        recovered_at=None,
        resolved_at=None,
    )
    cost = incident_cost(open_, h, typical_step=10.0, end=250)
    assert cost.ongoing and cost.resumed_at is None and cost.lost == Interval(100, 250)
    assert cost.segments == {"detect": 17, "approve": 0, "recover": 130, "redo": 3}
    # Steps went on at 12 s instead of 10 s during a straggler incident: 2 s a step lost.
    slow = StepHistory(_steady(100) + [StepPoint(100 + 12 * i, 10 + i) for i in range(1, 6)])
    facts = IncidentFacts(
        id=4,
        kind="straggler",
        tier="light",
        fault_at=100,
        detected_at=124,
        recovered_at=148,
        resolved_at=170,
    )
    cost = incident_cost(facts, slow, typical_step=10.0, end=1000)
    assert cost.resumed_at == 160 and cost.lost_seconds == 10.0  # 60 s span, 5 steps of 10
    assert sum(cost.segments.values()) == 10.0


def test_without_recorded_progress_the_cost_runs_from_fault_to_recovery() -> None:
    facts = IncidentFacts(
        id=5,
        kind="rollout_down",
        tier="medium",
        fault_at=50,
        detected_at=60,
        recovered_at=90,
        resolved_at=120,
        approval_waits=(Interval(60, 70),),
    )
    cost = incident_cost(facts, StepHistory([StepPoint(0, 0)]), typical_step=None, end=500)
    assert cost.lost == Interval(50, 90) and cost.resumed_at == 90 and not cost.ongoing
    assert cost.segments == {"detect": 10, "approve": 10, "recover": 20, "redo": 0}
    unresolved = IncidentFacts(
        id=6,
        kind="rollout_down",
        tier="medium",
        fault_at=50,
        detected_at=60,
        recovered_at=None,
        resolved_at=None,
    )
    cost = incident_cost(unresolved, StepHistory([]), typical_step=None, end=500)
    assert cost.ongoing and cost.lost == Interval(50, 500)
