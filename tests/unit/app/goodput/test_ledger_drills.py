"""A drill's incident in the ledger: listed with its own cost and whole-job-restart figure,
never counted in the job's lost time, ETTR or counterfactual."""

from __future__ import annotations

import pytest

from app.goodput.breakdown import IncidentFacts
from app.goodput.ledger import LedgerInput, build_ledger
from app.goodput.steps import StepPoint


def _ledger(incidents: list[IncidentFacts]):  # type: ignore[no-untyped-def]
    steps = [StepPoint(float(t), t // 10) for t in range(0, 201, 10)]
    steps += [StepPoint(float(t), 21 + (t - 300) // 10) for t in range(300, 1001, 10)]
    return build_ledger(
        LedgerInput(
            job="j",
            since=0.0,
            until=1000.0,
            first_seen=0.0,
            last_seen=1000.0,
            steps=steps,
            incidents=incidents,
            checkpoints=[],
            gpu_count=16,
            gpu_count_source="reported",
            price_per_gpu_hour=2.5,
            human_detection_seconds=1800.0,
            checkpoint_every_steps=50,
        )
    )


def test_a_drill_is_shown_with_its_cost_and_left_out_of_the_ettr() -> None:
    fault = dict(
        id=1,
        kind="heartbeat_lost",
        tier="medium",
        fault_at=205,
        detected_at=220,
        recovered_at=280,
        resolved_at=290,
    )
    real = _ledger([IncidentFacts(**fault)])  # type: ignore[arg-type]
    drill = _ledger([IncidentFacts(**fault, drill=True)])  # type: ignore[arg-type]
    assert real.ettr == pytest.approx(0.91) and real.lost_seconds == 90.0
    [row] = drill.incidents
    assert row.drill is True and row.lost_seconds == 90.0 and row.counted_seconds == 0.0
    assert row.whole_job_restart_seconds == real.incidents[0].whole_job_restart_seconds == 2005.0
    assert drill.ettr == 1.0 and drill.lost_seconds == 0.0 and drill.gpu_hours_lost == 0.0
    assert drill.counterfactual.lost_seconds == 0.0
    assert all(p.ettr == 1.0 for p in drill.series)
