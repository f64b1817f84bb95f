"""HeartbeatReporter: the heartbeat file format, the write interval, atomicity, bad input."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from recovery.errors import RecoveryError
from recovery.report import HeartbeatError, HeartbeatReporter, heartbeat_path


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def read(path: Path) -> dict:
    return json.loads(path.read_text())


def test_first_update_writes_the_documented_fields(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "rollout", 3, job="grpo-7b", clock=clock, pid=4242)
    assert rep.update(phase="ROLLOUT", step=12, tokens=5000, pending=2, scheduled=10)
    doc = read(heartbeat_path(tmp_path, "rollout", 3))
    assert doc == {
        "format": 1,
        "job": "grpo-7b",
        "role": "rollout",
        "rank": 3,
        "pid": 4242,
        "phase": "ROLLOUT",
        "step": 12,
        "tokens_generated": 5000,
        "rollouts_pending": 2,
        "rollouts_scheduled": 10,
        "shard_rebuilds": [],
        "shard_rebuilds_total": 0,
        "state_log_write_latency_ms": None,
        "train_step_failures_total": 0,
        "train_last_failed_step": None,
        "rollout_batch_timeouts_total": 0,
        "stale_shards": [],
        "state_log_write_errors_total": 0,
        "checkpoint_write_errors_total": 0,
        "snapshot_persist_errors_total": 0,
        "snapshot_persist_last_error": None,
        "checkpoint_step": None,
        "checkpoint_inference_version": None,
        "signals": {},
        "first_step_budget_seconds": None,
        "rollout_failed_samples_total": None,
        "rollout_samples_total": None,
        "updated_at": 1000.0,
        "ts": 1000.0,
    }
    assert rep.path == tmp_path / "heartbeat" / "rollout-3.json"


def test_job_defaults_to_run_directory_name(tmp_path: Path) -> None:
    run = tmp_path / "my-run"
    rep = HeartbeatReporter(run, "trainer", 0, clock=FakeClock())
    rep.flush()
    assert read(rep.path)["job"] == "my-run"


def test_writes_at_most_once_per_interval_but_keeps_latest_values(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "trainer", 0, interval=2.0, clock=clock)
    assert rep.update(step=1)
    clock.now += 0.5
    assert not rep.update(step=2)
    assert read(rep.path)["step"] == 1
    clock.now += 1.6
    assert rep.update(phase="TRAIN")
    doc = read(rep.path)
    assert (doc["step"], doc["phase"], doc["ts"]) == (2, "TRAIN", 1002.1)


def test_field_left_out_is_kept_and_none_clears(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "rollout", 0, clock=clock)
    rep.update(pending=4, scheduled=8, force=True)
    rep.update(step=3, force=True)
    assert read(rep.path)["rollouts_pending"] == 4
    rep.update(pending=None, force=True)
    assert read(rep.path)["rollouts_pending"] is None


def test_add_tokens_accumulates(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "rollout", 0, interval=1.0, clock=clock)
    rep.add_tokens(100)
    rep.add_tokens(50)
    clock.now += 1
    rep.add_tokens(25)
    assert read(rep.path)["tokens_generated"] == 175


def test_shard_rebuilds_are_written_immediately_and_age_out_after_5_minutes(tmp_path: Path) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "trainer", 1, interval=60.0, clock=clock)
    rep.update(step=1)
    clock.now += 1
    assert rep.record_shard_rebuild()
    clock.now += 200
    assert rep.record_shard_rebuild()
    doc = read(rep.path)
    assert doc["shard_rebuilds"] == [1001.0, 1201.0]
    assert doc["shard_rebuilds_total"] == 2
    clock.now += 150  # first rebuild is now 350 s old
    rep.flush()
    doc = read(rep.path)
    assert doc["shard_rebuilds"] == [1201.0]
    assert doc["shard_rebuilds_total"] == 2


def test_state_log_latency(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock())
    rep.record_state_log_latency(12.5)
    assert read(rep.path)["state_log_write_latency_ms"] == 12.5


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"role": "roll-out"}, "roll-out"),
        ({"role": ""}, "role"),
        ({"role": "a/b"}, "a/b"),
        ({"rank": -1}, "-1"),
        ({"rank": "0"}, "'0'"),
        ({"rank": True}, "True"),
        ({"interval": 0}, "interval"),
        ({"interval": float("nan")}, "nan"),
        ({"job": "  "}, "job"),
        ({"job": "my job"}, "'my job'"),
        ({"job": "-x"}, "'-x'"),
    ],
)
def test_bad_constructor_arguments_name_the_value(
    tmp_path: Path, kwargs: dict, needle: str
) -> None:
    args = {"role": "trainer", "rank": 0} | kwargs
    with pytest.raises(HeartbeatError) as info:
        HeartbeatReporter(tmp_path, args.pop("role"), args.pop("rank"), **args)
    assert needle in str(info.value)
    assert isinstance(info.value, RecoveryError)
    assert not (tmp_path / "heartbeat").exists() or not any((tmp_path / "heartbeat").iterdir())


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"step": -3}, "-3"),
        ({"tokens": 1.5}, "1.5"),
        ({"pending": "2"}, "'2'"),
        ({"scheduled": True}, "True"),
        ({"phase": ""}, "phase"),
        ({"phase": "in progress"}, "'in progress'"),
        ({"state_log_latency_ms": float("inf")}, "inf"),
        ({"state_log_latency_ms": -1.0}, "-1.0"),
    ],
)
def test_bad_update_changes_nothing(tmp_path: Path, kwargs: dict, needle: str) -> None:
    clock = FakeClock()
    rep = HeartbeatReporter(tmp_path, "rollout", 0, clock=clock)
    rep.update(phase="ROLLOUT", step=5, tokens=10, pending=1, scheduled=2, force=True)
    before = rep.path.read_bytes()
    clock.now += 10
    with pytest.raises(HeartbeatError) as info:
        rep.update(**({"step": 6} | kwargs))
    assert needle in str(info.value)
    assert rep.path.read_bytes() == before
    assert rep.snapshot()["step"] == 5


def test_concurrent_updates_from_threads_leave_a_valid_file(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "rollout", 0, interval=0.0001)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for i in range(200):
                rep.update(step=k * 1000 + i, force=True)
                rep.add_tokens(1)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    rep.flush()
    doc = read(rep.path)
    assert doc["tokens_generated"] == 800
    assert [p.name for p in rep.path.parent.iterdir()] == ["rollout-0.json"]


def test_keepalive_refreshes_ts_without_updates_and_close_stops_it(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, interval=0.05)
    rep.update(step=1, force=True)
    first = read(rep.path)
    rep.start_keepalive()
    time.sleep(0.4)
    rep.close(timeout=2)
    later = read(rep.path)
    assert later["ts"] > first["ts"]
    assert later["updated_at"] == first["updated_at"]
    assert later["step"] == 1
    closed_ts = later["ts"]
    time.sleep(0.2)
    assert read(rep.path)["ts"] == closed_ts


def _writer_forever(run_dir: str) -> None:
    rep = HeartbeatReporter(run_dir, "rollout", 7, interval=0.0001)
    i = 0
    while True:
        i += 1
        rep.update(step=i, tokens=i * 10, pending=i % 5, scheduled=5, force=True)


def test_reader_never_sees_a_partial_file_even_when_writer_is_killed(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_writer_forever, args=(str(tmp_path),))
    proc.start()
    path = heartbeat_path(tmp_path, "rollout", 7)
    try:
        deadline = time.monotonic() + 30
        while not path.exists():
            assert time.monotonic() < deadline, "writer never produced a heartbeat"
            time.sleep(0.01)
        reads = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            doc = json.loads(path.read_bytes())  # would raise on a torn file
            assert doc["tokens_generated"] == doc["step"] * 10
            reads += 1
        assert reads > 50
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    doc = json.loads(path.read_bytes())
    assert doc["tokens_generated"] == doc["step"] * 10


def test_default_job_from_an_awkward_run_directory_name(tmp_path: Path) -> None:
    rep = HeartbeatReporter(tmp_path / "run #7", "trainer", 0, clock=FakeClock())
    rep.flush()
    assert read(rep.path)["job"] == "run__7"


@pytest.mark.parametrize("bad", [float("nan"), -5.0, "now", True])
def test_bad_rebuild_timestamp_is_refused(tmp_path: Path, bad: object) -> None:
    rep = HeartbeatReporter(tmp_path, "trainer", 0, clock=FakeClock())
    with pytest.raises(HeartbeatError, match="ts must be"):
        rep.record_shard_rebuild(bad)  # type: ignore[arg-type]
    assert rep.snapshot()["shard_rebuilds_total"] == 0
