"""A framework's training signals: reporter ``set_signals`` -> heartbeat file -> agent samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.collectors.job import JobCollector
from recovery.protocol.heartbeat import HeartbeatInvalid, parse_heartbeat
from recovery.protocol.metric_names import JOB_METRICS, TRAINER_SIGNALS
from recovery.report import HeartbeatReporter


def test_names_are_documented_and_job_signals() -> None:
    docs = (Path(__file__).parents[4] / "docs" / "metrics.md").read_text()
    for name in TRAINER_SIGNALS:
        assert name in JOB_METRICS
        assert f"| `{name}` |" in docs


def test_known_signals_are_forwarded_with_the_participant_labels(tmp_path: Path) -> None:
    reporter = HeartbeatReporter(tmp_path, "trainer", 1, job="grpo", interval=60)
    reporter.set_signals({"grpo_reward_mean": 0.75, "grpo_kl": 0.01, "my_own_metric": 3.0})
    reporter.flush()
    samples, _ = JobCollector(tmp_path).collect()
    got = {
        s["name"]: (s["value"], s["labels"])
        for s in samples
        if s["name"].startswith(("grpo", "my"))
    }
    labels = {"job": "grpo", "role": "trainer", "rank": "1"}
    # A name the agent does not know is not forwarded (it could be anything).
    assert got == {"grpo_reward_mean": (0.75, labels), "grpo_kl": (0.01, labels)}


@pytest.mark.parametrize("signals", [[1.0], "x", {"grpo_kl": "high"}, {"grpo_kl": True}])
def test_malformed_signals_make_the_heartbeat_invalid(signals: object) -> None:
    doc = {"role": "trainer", "rank": 0, "ts": 1.0, "signals": signals}
    with pytest.raises(HeartbeatInvalid, match="signals|grpo_kl"):
        parse_heartbeat(json.dumps(doc).encode(), "job")


def test_heartbeat_without_signals_still_parses() -> None:
    hb = parse_heartbeat(json.dumps({"role": "trainer", "rank": 0, "ts": 1.0}).encode(), "job")
    assert hb.signals == ()
