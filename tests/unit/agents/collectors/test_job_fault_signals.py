"""The job collector turns the heartbeat's fault fields into the series the policy engine reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.collectors.job import JobCollector
from recovery.protocol import metric_names as policy_names
from recovery.protocol.heartbeat import HeartbeatInvalid, parse_heartbeat
from recovery.protocol.metric_names import JOB_METRICS
from recovery.report import HeartbeatReporter

FAULT_SERIES = (
    "train_step_failures_total",
    "train_last_failed_step",
    "rollout_batch_timeouts_total",
    "actor_shard_stale",
    "state_log_write_errors_total",
    "checkpoint_write_errors_total",
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def values(samples: list[Any], role: str, rank: int) -> dict[str, float]:
    return {
        s["name"]: s["value"]
        for s in samples
        if s["name"] in FAULT_SERIES
        and s["labels"] == {"job": "grpo", "role": role, "rank": str(rank)}
    }


def test_the_names_are_the_ones_the_policy_engine_reads() -> None:
    assert set(FAULT_SERIES) <= JOB_METRICS
    assert set(FAULT_SERIES) == {
        policy_names.TRAIN_STEP_FAILURES_TOTAL,
        policy_names.TRAIN_LAST_FAILED_STEP,
        policy_names.ROLLOUT_BATCH_TIMEOUTS_TOTAL,
        policy_names.ACTOR_SHARD_STALE,
        policy_names.STATE_LOG_WRITE_ERRORS_TOTAL,
        policy_names.CHECKPOINT_WRITE_ERRORS_TOTAL,
    }
    docs = (Path(__file__).parents[4] / "docs" / "metrics.md").read_text()
    for name in FAULT_SERIES:
        assert f"| `{name}` |" in docs


def test_fault_fields_become_series_per_participant(tmp_path: Path) -> None:
    clock = Clock()
    trainer = HeartbeatReporter(tmp_path, "trainer", 0, job="grpo", clock=clock)
    rollout = HeartbeatReporter(tmp_path, "rollout", 2, job="grpo", clock=clock)
    trainer.update(phase="TRAIN", step=4, force=True)
    rollout.update(phase="ROLLOUT", force=True)
    col = JobCollector(tmp_path, clock=clock)
    samples, _ = col.collect()
    # counters start at 0 so that the first failure is an increase; no failed step yet
    assert values(samples, "trainer", 0) == {
        "train_step_failures_total": 0,
        "rollout_batch_timeouts_total": 0,
        "actor_shard_stale": 0,
        "state_log_write_errors_total": 0,
        "checkpoint_write_errors_total": 0,
    }
    trainer.record_step_failure(4)
    trainer.record_state_log_error()
    trainer.record_checkpoint_error()
    rollout.record_rollout_timeout()
    rollout.set_shard_stale("rank2", True)
    clock.now += 1
    samples, _ = col.collect()
    assert values(samples, "trainer", 0) == {
        "train_step_failures_total": 1,
        "train_last_failed_step": 4,
        "rollout_batch_timeouts_total": 0,
        "actor_shard_stale": 0,
        "state_log_write_errors_total": 1,
        "checkpoint_write_errors_total": 1,
    }
    assert values(samples, "rollout", 2) == {
        "train_step_failures_total": 0,
        "rollout_batch_timeouts_total": 1,
        "actor_shard_stale": 1,
        "state_log_write_errors_total": 0,
        "checkpoint_write_errors_total": 0,
    }
    rollout.set_shard_stale("rank2", False)
    samples, _ = col.collect()
    assert values(samples, "rollout", 2)["actor_shard_stale"] == 0


def test_snapshot_persist_errors_are_sent_with_the_last_dir_and_error(tmp_path: Path) -> None:
    clock = Clock()
    trainer = HeartbeatReporter(tmp_path, "trainer", 0, job="grpo", clock=clock)
    trainer.update(phase="TRAIN", step=4, force=True)
    col = JobCollector(tmp_path, clock=clock)
    samples, _ = col.collect()
    assert [s["value"] for s in samples if s["name"] == "snapshot_persist_errors_total"] == [0]
    assert not [s for s in samples if s["name"] == "snapshot_persist_last_error"]
    trainer.record_snapshot_persist_error("/runs/grpo/snapshots/rank-0", "[Errno 28] No space")
    trainer.record_snapshot_persist_error("/runs/grpo/snapshots/rank-0", "[Errno 28] No space")
    clock.now += 1
    samples, _ = col.collect()
    by_name = {s["name"]: s for s in samples if s["name"].startswith("snapshot_persist")}
    assert by_name["snapshot_persist_errors_total"]["value"] == 2
    last = by_name["snapshot_persist_last_error"]
    assert last["value"] == 2 and last["labels"] == {
        "job": "grpo",
        "role": "trainer",
        "rank": "0",
        "dir": "/runs/grpo/snapshots/rank-0",
        "error": "[Errno 28] No space",
    }
    assert values(samples, "trainer", 0)["checkpoint_write_errors_total"] == 0


def test_a_heartbeat_of_an_older_reporter_sends_no_fault_series(tmp_path: Path) -> None:
    (tmp_path / "heartbeat").mkdir()
    doc = {"format": 1, "job": "grpo", "role": "trainer", "rank": 0, "phase": "TRAIN", "ts": 1.0}
    (tmp_path / "heartbeat" / "trainer-0.json").write_text(json.dumps(doc))
    samples, participants = JobCollector(tmp_path, clock=Clock()).collect()
    assert participants and values(samples, "trainer", 0) == {}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("train_step_failures_total", -1, "field 'train_step_failures_total' is not a count: -1"),
        ("train_step_failures_total", "3", "field 'train_step_failures_total' is not a count"),
        ("train_last_failed_step", 1.5, "field 'train_last_failed_step' is not a count: 1.5"),
        ("train_last_failed_step", 2**63, "field 'train_last_failed_step' is above 2\\*\\*62"),
        ("rollout_batch_timeouts_total", True, "field 'rollout_batch_timeouts_total'"),
        ("state_log_write_errors_total", [], "field 'state_log_write_errors_total'"),
        ("checkpoint_write_errors_total", 2.5, "field 'checkpoint_write_errors_total'"),
        ("snapshot_persist_errors_total", -1, "field 'snapshot_persist_errors_total'"),
        ("snapshot_persist_last_error", "full", "field 'snapshot_persist_last_error' is not a"),
        ("snapshot_persist_last_error", {"dir": "/d"}, "field 'snapshot_persist_last_error'"),
        ("stale_shards", "rank0", "field 'stale_shards' is not a list of shard ids: 'rank0'"),
        ("stale_shards", [3], "field 'stale_shards' is not a list of shard ids: \\[3\\]"),
        ("stale_shards", [""], "field 'stale_shards' is not a list of shard ids"),
    ],
)
def test_a_bad_fault_field_makes_the_heartbeat_invalid(
    field: str, value: object, message: str
) -> None:
    doc = {"role": "trainer", "rank": 0, "ts": 1.0, field: value}
    with pytest.raises(HeartbeatInvalid, match=message):
        parse_heartbeat(json.dumps(doc).encode(), "job")


def test_a_bad_fault_field_skips_only_that_participant(tmp_path: Path) -> None:
    clock = Clock()
    HeartbeatReporter(tmp_path, "rollout", 1, job="grpo", clock=clock).flush()
    bad = {"role": "trainer", "rank": 0, "ts": clock.now, "stale_shards": {"rank0": True}}
    (tmp_path / "heartbeat" / "trainer-0.json").write_text(json.dumps(bad))
    col = JobCollector(tmp_path, clock=clock)
    samples, participants = col.collect()
    assert [p.role for p in participants] == ["rollout"]
    assert col.skipped_last_round == 1
    assert values(samples, "rollout", 1)["actor_shard_stale"] == 0
