"""HeartbeatReporter.set_signals: a framework's training metrics in the heartbeat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recovery.report import HeartbeatError, HeartbeatReporter


def _read(reporter: HeartbeatReporter) -> dict[str, object]:
    doc = json.loads(reporter.path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_signals_merge_and_are_written(tmp_path: Path) -> None:
    reporter = HeartbeatReporter(tmp_path, "trainer", 0, interval=60)
    reporter.flush()
    assert _read(reporter)["signals"] == {}
    reporter.set_signals({"grpo_reward_mean": 0.5, "grpo_kl": 1})
    reporter.set_signals({"grpo_kl": 0.25})
    reporter.flush()
    assert _read(reporter)["signals"] == {"grpo_reward_mean": 0.5, "grpo_kl": 0.25}


@pytest.mark.parametrize(
    "bad",
    [{"Bad-Name": 1.0}, {"grpo_kl": float("nan")}, {"grpo_kl": float("inf")}, {"grpo_kl": "1"},
     {"grpo_kl": True}, {f"s{i}": 1.0 for i in range(33)}, [("grpo_kl", 1.0)]],
)  # fmt: skip
def test_bad_signals_are_refused_and_change_nothing(tmp_path: Path, bad: object) -> None:
    reporter = HeartbeatReporter(tmp_path, "trainer", 0, interval=60)
    reporter.set_signals({"grpo_reward_mean": 0.5})
    with pytest.raises(HeartbeatError):
        reporter.set_signals(bad)  # type: ignore[arg-type]
    assert reporter.snapshot()["signals"] == {"grpo_reward_mean": 0.5}
