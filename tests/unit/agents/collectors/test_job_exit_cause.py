"""The job collector sends the cause a launcher wrote with an exit as participant_exit_cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.collectors.job import JobCollector
from recovery.launcher_reports import report_process_exit
from recovery.protocol import metric_names as policy_names
from recovery.protocol.heartbeat import HeartbeatInvalid, parse_heartbeat
from recovery.protocol.metric_names import JOB_METRICS

LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB " + "x" * 200


def test_an_exit_with_a_cause_becomes_one_sample_with_the_line(tmp_path: Path) -> None:
    assert policy_names.PARTICIPANT_EXIT_CAUSE in JOB_METRICS
    report_process_exit(
        tmp_path,
        "trainer",
        0,
        job="grpo",
        pid=42,
        returncode=1,
        exit_cause={"cause": "cuda_oom", "kind": "cuda_oom", "line": LINE, "source": "PyTorch"},
        clock=lambda: 1_700_000_000.0,
    )
    samples, parts = JobCollector(tmp_path, clock=lambda: 1_700_000_001.0).collect()
    [sample] = [s for s in samples if s["name"] == "participant_exit_cause"]
    assert sample["value"] == 1_700_000_000.0  # the exit's time
    labels = sample["labels"]
    assert labels["cause"] == "cuda_oom" and labels["kind"] == "cuda_oom"
    assert labels["line"] == LINE[:120] and (labels["job"], labels["role"]) == ("grpo", "trainer")
    assert parts[0].phase == "EXITED"


def test_a_later_exit_without_a_cause_drops_the_earlier_cause(tmp_path: Path) -> None:
    cause = {"cause": "cuda_oom", "kind": "cuda_oom", "line": "x", "source": "s"}
    report_process_exit(tmp_path, "trainer", 0, job="grpo", pid=1, returncode=1, exit_cause=cause)
    report_process_exit(tmp_path, "trainer", 0, job="grpo", pid=2, returncode=-9)
    samples, _ = JobCollector(tmp_path).collect()
    assert not [s for s in samples if s["name"] == "participant_exit_cause"]
    # ... and a clean exit never carries one.
    report_process_exit(tmp_path, "trainer", 0, job="grpo", pid=3, returncode=0, exit_cause=cause)
    assert "exit_cause" not in json.loads((tmp_path / "heartbeat" / "trainer-0.json").read_text())


@pytest.mark.parametrize(
    "bad",
    [
        {"cause": "a b", "kind": "k", "line": "l"},
        {"cause": "a", "line": "l"},
        "cuda_oom",
        {"cause": "a", "kind": "k", "line": 3},
    ],
)
def test_a_malformed_cause_names_the_field(bad: object) -> None:
    doc = {"role": "trainer", "rank": 0, "ts": 1.0, "phase": "EXITED", "exit_cause": bad}
    with pytest.raises(HeartbeatInvalid, match="field 'exit_cause'"):
        parse_heartbeat(json.dumps(doc).encode(), "grpo")
