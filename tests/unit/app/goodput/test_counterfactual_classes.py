"""Per-class counterfactual figures: a class's own detection and restart times replace the
defaults for its kinds, cited, and the saved figures say what they assume."""

from __future__ import annotations

import pytest

from app.goodput.breakdown import IncidentFacts
from app.goodput.counterfactual import class_costs
from app.goodput.ledger import LedgerInput, build_ledger
from app.goodput.report import assumption_rows, markdown, summary_rows
from app.goodput.steps import StepPoint
from app.policy.policy_file import PolicyFileError, default_policy, parse_policy

STEPS = [StepPoint(float(t), t // 10) for t in range(0, 201, 10)] + [
    StepPoint(float(t), 21 + (t - 300) // 10) for t in range(300, 1001, 10)
]


def _ledger(kind: str, classes: object) -> object:
    fact = IncidentFacts(
        id=1,
        kind=kind,
        tier="medium",
        fault_at=205,
        detected_at=220,
        recovered_at=280,
        resolved_at=290,
    )
    return build_ledger(
        LedgerInput(
            job="j",
            since=0.0,
            until=1000.0,
            first_seen=0.0,
            last_seen=1000.0,
            steps=STEPS,
            incidents=[fact],
            checkpoints=[],
            gpu_count=8,
            gpu_count_source="reported",
            price_per_gpu_hour=2.0,
            human_detection_seconds=1800.0,
            checkpoint_every_steps=50,
            class_costs=classes,  # type: ignore[arg-type]
        )
    )


def test_the_policy_cites_a_source_for_every_class() -> None:
    classes = default_policy().counterfactual.classes
    assert {"engine", "collective"} <= set(classes)
    assert (
        "vLLM #19824" in classes["engine"].source and "NCCL #1156" in classes["collective"].source
    )
    assert classes["engine"].restart_seconds == 215 and classes["engine"].detection_seconds == 15
    assert classes["collective"].restart_seconds == 150


def test_a_class_replaces_the_default_detection_and_start_up_for_its_kinds() -> None:
    costs = class_costs(default_policy().counterfactual.classes)
    plain = _ledger("node_silent", costs)  # in no class: 1800 s human delay + measured 0 s
    engine = _ledger("rollout_engine_down", costs)
    [p], [e] = plain.incidents, engine.incidents  # type: ignore[attr-defined]
    # partial step (205 - 200) + detection + restart + redone steps (20 since checkpoint 0)
    assert p.whole_job_restart_seconds == pytest.approx(5 + 1800 + 0 + 20 * 10)
    assert e.whole_job_restart_seconds == pytest.approx(5 + 15 + 215 + 20 * 10)
    a = engine.counterfactual.assumptions  # type: ignore[attr-defined]
    assert [c.name for c in a.classes] == ["engine"] and "rollout_engine_down" in a.classes[0].kinds
    assert "engine: detected after 15 s, restart 215 s (NeMo-RL" in a.summary
    assert plain.counterfactual.assumptions.classes == []  # type: ignore[attr-defined]
    # shown next to every saved figure, and listed with its source in the report
    saved = dict(summary_rows(engine))  # type: ignore[arg-type]
    assert "assuming a person notices after 1800 s" in saved["GPU-hours saved"]
    assert "vLLM #19824" in saved["money saved"]
    rows = dict(assumption_rows(engine))  # type: ignore[arg-type]
    assert any(k.startswith("class engine (") for k in rows)
    assert "vLLM #19824" in markdown(engine)  # type: ignore[arg-type]


def test_a_kind_in_two_classes_or_a_class_without_source_is_refused() -> None:
    data = default_policy().model_dump(mode="json")
    data["counterfactual"]["classes"]["other"] = {"kinds": ["train_hang"], "source": "x"}
    with pytest.raises(PolicyFileError, match="train_hang is already in class collective"):
        parse_policy(data)
    data["counterfactual"]["classes"]["other"] = {"kinds": ["gpu_lost"], "restart_seconds": 9}
    with pytest.raises(PolicyFileError, match="source"):
        parse_policy(data)
