"""Job collector: heartbeat files written by the real HeartbeatReporter, and the state-log tail."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest

from agents.collectors.job import JobCollector
from recovery.protocol.heartbeat import HeartbeatInvalid, parse_heartbeat
from recovery.protocol.metric_names import JOB_METRICS
from recovery.report import HeartbeatReporter


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def series(samples: list, name: str, role: str | None = None, rank: int | None = None) -> list:
    return [
        s["value"]
        for s in samples
        if s["name"] == name
        and (role is None or s["labels"].get("role") == role)
        and (rank is None or s["labels"].get("rank") == str(rank))
    ]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_golden_metrics_from_reporter_files(tmp_path: Path, clock: Clock) -> None:
    rollout = HeartbeatReporter(tmp_path, "rollout", 1, job="grpo", clock=clock, interval=1)
    trainer = HeartbeatReporter(tmp_path, "trainer", 0, job="grpo", clock=clock, interval=1)
    rollout.update(phase="ROLLOUT", tokens=1000, pending=3, scheduled=10, state_log_latency_ms=12.0)
    trainer.update(phase="TRAIN", step=41)
    trainer.record_shard_rebuild()
    col = JobCollector(tmp_path, clock=clock)
    clock.now += 2
    samples, participants = col.collect()
    assert {s["name"] for s in samples} <= JOB_METRICS
    assert series(samples, "rollout_pending_ratio", "rollout", 1) == [0.3]
    assert series(samples, "state_log_write_latency_ms", "rollout", 1) == [12.0]
    assert series(samples, "train_step", "trainer", 0) == [41]
    assert series(samples, "actor_shard_rebuild_count_5m", "trainer", 0) == [1]
    assert series(samples, "participant_heartbeat_age_seconds", "trainer", 0) == [2.0]
    assert series(samples, "rollout_tokens_per_second") == []  # needs two heartbeats
    assert [asdict(p) for p in sorted(participants, key=lambda p: p.role)] == [
        {
            "job": "grpo",
            "role": "rollout",
            "rank": 1,
            "phase": "ROLLOUT",
            "step": 0,
            "ts": clock.now - 2,
        },
        {
            "job": "grpo",
            "role": "trainer",
            "rank": 0,
            "phase": "TRAIN",
            "step": 41,
            "ts": clock.now - 2,
        },
    ]
    labels = next(s["labels"] for s in samples if s["name"] == "train_step")
    assert labels == {"job": "grpo", "role": "trainer", "rank": "0"}
    # tokens/s from the increase between two heartbeats
    rollout.update(tokens=1600, force=True)  # written at now (2 s after the first)
    samples, _ = col.collect()
    assert series(samples, "rollout_tokens_per_second", "rollout", 1) == [300.0]
    # unchanged heartbeat: no new rate (the age tells the story)
    clock.now += 5
    samples, _ = col.collect()
    assert series(samples, "rollout_tokens_per_second") == []
    assert series(samples, "participant_heartbeat_age_seconds", "rollout", 1) == [5.0]
    # rebuild count ages out after five minutes
    clock.now += 400
    samples, _ = col.collect()
    assert series(samples, "actor_shard_rebuild_count_5m", "trainer", 0) == [0]
    assert series(samples, "actor_shard_rebuilds_total", "trainer", 0) == [1]


def test_counter_reset_after_restart_gives_no_negative_rate(tmp_path: Path, clock: Clock) -> None:
    rep = HeartbeatReporter(tmp_path, "rollout", 0, clock=clock, interval=1)
    rep.update(tokens=5000, force=True)
    col = JobCollector(tmp_path, clock=clock)
    col.collect()
    clock.now += 1
    HeartbeatReporter(tmp_path, "rollout", 0, clock=clock).update(tokens=10, force=True)
    samples, _ = col.collect()
    assert series(samples, "rollout_tokens_per_second") == []
    clock.now += 1
    HeartbeatReporter(tmp_path, "rollout", 0, clock=clock).update(tokens=110, force=True)
    samples, _ = col.collect()
    assert series(samples, "rollout_tokens_per_second") == [100.0]


@pytest.mark.parametrize(
    "content",
    [
        b'{"role": "rollout", "rank": 2, "ts": 17000',  # half-written
        b"",
        b"\x00\xff garbage",
        b"[1, 2, 3]",
        b'{"rank": 2, "ts": 1.0}',
        b'{"role": "rollout", "rank": -2, "ts": 1.0}',
        b'{"role": "rollout", "rank": 2, "ts": "yesterday"}',
        b'{"role": "rollout", "rank": 2, "ts": 1.0, "rollouts_pending": "many"}',
        b'{"role": "rollout worker", "rank": 2, "ts": 1.0}',
        b'{"role": "rollout", "rank": 2, "ts": 1.0, "phase": "in progress"}',
        b'{"role": "rollout", "rank": 2, "ts": 1.0, "job": "-job"}',
        b'{"role": "rollout", "rank": 2000000, "ts": 1.0}',
    ],
)
def test_corrupt_heartbeat_is_skipped_and_others_still_reported(
    tmp_path: Path, clock: Clock, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    HeartbeatReporter(tmp_path, "trainer", 0, clock=clock).update(step=3, force=True)
    (tmp_path / "heartbeat" / "rollout-2.json").write_bytes(content)
    col = JobCollector(tmp_path, clock=clock)
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.job"):
        for _ in range(3):
            samples, participants = col.collect()
            assert [p.role for p in participants] == ["trainer"]
            assert series(samples, "train_step") == [3]
            assert col.skipped_last_round == 1
    assert len([r for r in caplog.records if "rollout-2.json" in r.getMessage()]) == 1
    # repaired: picked up on the next round
    HeartbeatReporter(tmp_path, "rollout", 2, clock=clock).update(
        pending=1, scheduled=4, force=True
    )
    samples, participants = col.collect()
    assert series(samples, "rollout_pending_ratio", "rollout", 2) == [0.25]
    assert col.skipped_last_round == 0


def test_parse_heartbeat_error_names_the_field() -> None:
    with pytest.raises(HeartbeatInvalid, match="'rollouts_scheduled'.*-1"):
        parse_heartbeat(b'{"role":"r","rank":0,"ts":1,"rollouts_scheduled":-1}', "job")


def test_temporary_and_foreign_files_are_ignored(tmp_path: Path, clock: Clock) -> None:
    hb = tmp_path / "heartbeat"
    hb.mkdir()
    (hb / ".rollout-0.json.abc123").write_text("{half")
    (hb / "notes.txt").write_text("hello")
    samples, participants = JobCollector(tmp_path, clock=clock).collect()
    assert samples == [] and participants == []


def test_no_run_dir_content_yet_is_fine(tmp_path: Path, clock: Clock) -> None:
    col = JobCollector(tmp_path / "not-yet", clock=clock)
    assert col.collect() == ([], [])


def _line(ts: float, state: str) -> str:
    return json.dumps({"ts": ts, "state": state, "payload": {}}) + "\n"


def test_state_log_tail_counts_new_complete_lines_only(tmp_path: Path, clock: Clock) -> None:
    log_path = tmp_path / "state_log.jsonl"
    log_path.write_text(_line(clock.now - 100, "INIT") + _line(clock.now - 50, "ROLLOUT"))
    HeartbeatReporter(tmp_path, "trainer", 0, job="jobX", clock=clock).flush()
    col = JobCollector(tmp_path, clock=clock)
    samples, _ = col.collect()
    assert series(samples, "job_state_transitions_total") == [0]  # history is not "new"
    assert series(samples, "job_state_log_age_seconds") == [50.0]
    assert series(samples, "job_safe_mode") == [0]
    assert next(s for s in samples if s["name"] == "job_safe_mode")["labels"] == {"job": "jobX"}
    with log_path.open("a") as f:
        f.write(_line(clock.now - 1, "COLLECT"))
        f.write('{"ts": 1, "state": "TRA')  # torn: waits for its newline
    samples, _ = col.collect()
    assert series(samples, "job_state_transitions_total") == [1]
    assert series(samples, "job_state_log_age_seconds") == [1.0]
    with log_path.open("a") as f:
        f.write('IN"}\n')
        f.write("not json at all\n")
        f.write(_line(clock.now, "SAFE_MODE"))
    samples, _ = col.collect()
    assert series(samples, "job_state_transitions_total") == [3]
    assert series(samples, "job_safe_mode") == [1]
    # truncated / rotated: read from the start again
    log_path.write_text(_line(clock.now, "INIT"))
    samples, _ = col.collect()
    assert series(samples, "job_state_transitions_total") == [4]
    assert series(samples, "job_safe_mode") == [0]


def test_state_log_first_read_starts_in_the_tail_of_a_long_file(
    tmp_path: Path, clock: Clock
) -> None:
    log_path = tmp_path / "state_log.jsonl"
    with log_path.open("w") as f:
        for i in range(20000):
            f.write(_line(clock.now - 20000 + i, "ROLLOUT" if i % 2 else "TRAIN"))
    col = JobCollector(tmp_path, clock=clock)
    samples, _ = col.collect()
    assert series(samples, "job_state_log_age_seconds") == [1.0]
    assert series(samples, "job_state_transitions_total") == [0]


def test_run_directory_name_is_made_a_valid_job_name(tmp_path: Path, clock: Clock) -> None:
    run = tmp_path / "my run (v2)"
    hb = run / "heartbeat"
    hb.mkdir(parents=True)
    (hb / "trainer-0.json").write_text('{"role": "trainer", "rank": 0, "ts": 1.0}')
    _samples, participants = JobCollector(run, clock=clock).collect()
    assert participants[0].job == "my_run__v2_"


def test_heartbeat_from_the_future_is_skipped(tmp_path: Path, clock: Clock) -> None:
    hb = tmp_path / "heartbeat"
    hb.mkdir()
    (hb / "trainer-0.json").write_text(
        json.dumps({"role": "trainer", "rank": 0, "ts": clock.now + 3600})
    )
    (hb / "trainer-1.json").write_text(
        json.dumps({"role": "trainer", "rank": 1, "ts": clock.now + 1})
    )
    col = JobCollector(tmp_path, clock=clock)
    _samples, participants = col.collect()
    assert [p.rank for p in participants] == [1]
    assert col.skipped_last_round == 1
