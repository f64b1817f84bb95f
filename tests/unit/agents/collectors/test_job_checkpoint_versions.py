"""The last committed checkpoint's version vector: reporter -> heartbeat file -> agent gauges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.collectors.job import JobCollector
from recovery.protocol.heartbeat import HeartbeatInvalid, parse_heartbeat
from recovery.protocol.metric_names import JOB_METRICS
from recovery.report import HeartbeatError, HeartbeatReporter

NAMES = ("checkpoint_committed_step", "checkpoint_inference_version")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def _gauges(samples: list[Any]) -> dict[str, float]:
    return {s["name"]: s["value"] for s in samples if s["name"] in NAMES}


def test_names_are_documented_and_known_to_the_agent() -> None:
    docs = (Path(__file__).parents[4] / "docs" / "metrics.md").read_text()
    for name in NAMES:
        assert name in JOB_METRICS
        assert f"| `{name}` |" in docs


def test_a_committed_checkpoint_becomes_two_gauges(tmp_path: Path) -> None:
    clock = Clock()
    trainer = HeartbeatReporter(tmp_path, "trainer", 0, job="grpo", clock=clock, interval=60)
    trainer.update(phase="TRAIN", step=7, force=True)
    collector = JobCollector(tmp_path, clock=clock)
    samples, _ = collector.collect()
    assert _gauges(samples) == {}  # nothing committed yet: no gauge, not a 0

    clock.now += 1
    assert trainer.record_checkpoint(50, 12) is True  # written at once despite interval=60
    samples, _ = collector.collect()
    assert _gauges(samples) == {
        "checkpoint_committed_step": 50.0,
        "checkpoint_inference_version": 12.0,
    }
    labels = {s["name"]: s["labels"] for s in samples if s["name"] in NAMES}
    assert labels["checkpoint_committed_step"] == {"job": "grpo", "role": "trainer", "rank": "0"}

    clock.now += 1
    assert trainer.record_checkpoint(100, 13) is True
    assert trainer.record_checkpoint(50, 12) is False  # a late duplicate never moves it back
    doc = json.loads(trainer.path.read_text())
    assert (doc["checkpoint_step"], doc["checkpoint_inference_version"]) == (100, 13)


@pytest.mark.parametrize(
    ("step", "version"), [(-1, 0), (3, -2), (True, 1), (2.5, 1), (None, 1), ("7", 1)]
)
def test_bad_versions_are_refused_and_change_nothing(
    tmp_path: Path, step: object, version: object
) -> None:
    reporter = HeartbeatReporter(tmp_path, "trainer", 0, job="grpo")
    reporter.record_checkpoint(10, 2)
    with pytest.raises(HeartbeatError, match="must be"):
        reporter.record_checkpoint(step, version)  # type: ignore[arg-type]
    snap = reporter.snapshot()
    assert (snap["checkpoint_step"], snap["checkpoint_inference_version"]) == (10, 2)


def test_a_bad_checkpoint_field_in_a_file_is_named(tmp_path: Path) -> None:
    raw = json.dumps(
        {"role": "trainer", "rank": 0, "ts": 1.0, "job": "grpo", "checkpoint_step": -4}
    ).encode()
    with pytest.raises(HeartbeatInvalid, match="checkpoint_step"):
        parse_heartbeat(raw, "grpo")
