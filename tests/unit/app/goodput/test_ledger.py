"""The job's ledger over a window: ETTR, overlap counted once, the counterfactual."""

from __future__ import annotations

import pytest

from app.goodput.breakdown import IncidentFacts
from app.goodput.ledger import LedgerInput, build_ledger
from app.goodput.steps import StepPoint


def _input(steps: list[StepPoint], incidents: list[IncidentFacts], **kw: object) -> LedgerInput:
    base: dict = dict(
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
    base.update(kw)
    return LedgerInput(**base)


def test_no_fault_is_ettr_one() -> None:
    led = build_ledger(_input([StepPoint(float(t), t // 10) for t in range(0, 1001, 10)], []))
    assert led.ettr == 1.0 and led.lost_seconds == 0 and led.gpu_hours_lost == 0
    assert led.counterfactual.gpu_hours_saved == 0
    assert all(p.ettr == 1.0 for p in led.series)


def test_overlapping_incidents_count_once_and_the_counterfactual_shows_its_assumptions() -> None:
    # Steps every 10 s from t=0 (startup: first new step at 10 -> measured 0 s), stop after
    # step 20 at t=200, new steps again from 300 (step 21) on.
    steps = [StepPoint(float(t), t // 10) for t in range(0, 201, 10)]
    steps += [StepPoint(float(t), 21 + (t - 300) // 10) for t in range(300, 1001, 10)]
    a = IncidentFacts(
        id=1,
        kind="node_silent",
        tier="medium",
        fault_at=205,
        detected_at=220,
        recovered_at=280,
        resolved_at=290,
    )
    b = IncidentFacts(
        id=2,
        kind="gpu_xid",
        tier="medium",
        fault_at=210,
        detected_at=230,
        recovered_at=285,
        resolved_at=295,
    )
    led = build_ledger(_input(steps, [a, b]))
    # Each: lost [200, 290) = 90 s; together 90 s, not 180.
    assert [r.lost_seconds for r in led.incidents] == [90.0, 90.0]
    assert [r.counted_seconds for r in led.incidents] == [90.0, 0.0]
    assert led.lost_seconds == 90.0 and led.wall_seconds == 1000.0
    assert led.ettr == pytest.approx(0.91)
    assert led.gpu_hours_lost == pytest.approx(90 / 3600 * 16)
    assert led.cost_lost == pytest.approx(90 / 3600 * 16 * 2.5)
    # Whole-job restart: partial step 5 s + 1800 s human + 0 s start-up + 20 steps since the
    # assumed checkpoint at step 0 (every 50 steps) x 10 s = 2005 s; the second overlaps.
    cf = led.counterfactual
    assert led.incidents[0].whole_job_restart_seconds == 2005.0
    assert cf.lost_seconds == 2010.0  # b starts at the same step, 10 s later fault -> 2010
    assert cf.gpu_hours_saved == pytest.approx((2010 - 90) / 3600 * 16)
    assert cf.money_saved == pytest.approx((2010 - 90) / 3600 * 16 * 2.5)
    assert cf.ettr == pytest.approx(910 / (910 + 2010))
    assert cf.assumptions.checkpoint_source == "assumed every 50 steps"
    assert cf.assumptions.typical_step_seconds == 10.0
    assert cf.assumptions.startup_source == "measured"


def test_the_window_clips_the_wall_and_the_loss() -> None:
    steps = [StepPoint(float(t), t // 10) for t in range(0, 201, 10)]
    steps += [StepPoint(float(t), 21 + (t - 300) // 10) for t in range(300, 1001, 10)]
    a = IncidentFacts(
        id=1,
        kind="node_silent",
        tier="medium",
        fault_at=205,
        detected_at=220,
        recovered_at=280,
        resolved_at=290,
    )
    led = build_ledger(
        _input(steps, [a], since=250.0, until=500.0, checkpoints=[(150.0, 15), (195.0, 19)])
    )
    assert led.wall_seconds == 250 and led.lost_seconds == 40  # [250, 290)
    assert led.incidents[0].counted_seconds == 40
    assert led.incidents[0].whole_job_restart_steps_redone == 1  # checkpoint 19, mark 20
    outside = build_ledger(_input(steps, [a], since=600.0, until=900.0))
    assert outside.incidents == [] and outside.ettr == 1.0
