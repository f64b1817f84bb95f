"""A restarted participant keeps its predecessor's fault counters and checkpoint version:
``HeartbeatReporter.carry_over`` and the launcher's ``report_starting``."""

from __future__ import annotations

import json
from pathlib import Path

from recovery.launcher_reports import report_starting
from recovery.report import HeartbeatReporter, heartbeat_path, read_heartbeat


def test_report_starting_keeps_the_previous_counts_and_the_process_takes_them_over(
    tmp_path: Path,
) -> None:
    first = HeartbeatReporter(tmp_path, "trainer", 0, job="j", interval=60)
    first.record_step_failure(7)
    first.record_checkpoint_error()
    first.record_checkpoint(6, 6)
    report_starting(tmp_path, "trainer", 0, job="j", pid=4242)
    starting = read_heartbeat(heartbeat_path(tmp_path, "trainer", 0))
    assert starting is not None and starting["phase"] == "STARTING" and starting["pid"] == 4242
    assert (starting["train_step_failures_total"], starting["train_last_failed_step"]) == (1, 7)
    assert starting["checkpoint_write_errors_total"] == 1
    assert (starting["checkpoint_step"], starting["checkpoint_inference_version"]) == (6, 6)

    second = HeartbeatReporter(tmp_path, "trainer", 0, job="j", interval=60)
    assert second.carry_over(starting) is True
    second.record_step_failure(7)  # the same step failed again
    doc = json.loads(second.path.read_text())
    assert (doc["train_step_failures_total"], doc["train_last_failed_step"]) == (2, 7)


def test_carry_over_never_lowers_and_ignores_bad_values(tmp_path: Path) -> None:
    reporter = HeartbeatReporter(tmp_path, "trainer", 0, interval=60)
    reporter.record_step_failure(3)
    reporter.record_step_failure(4)
    assert (
        reporter.carry_over({"train_step_failures_total": 1, "train_last_failed_step": 9}) is False
    )
    bad = {"train_step_failures_total": "5", "checkpoint_write_errors_total": -1,
           "rollout_batch_timeouts_total": True, "checkpoint_step": 3.5}  # fmt: skip
    assert reporter.carry_over(bad) is False and reporter.carry_over(None) is False
    snap = reporter.snapshot()
    assert (snap["train_step_failures_total"], snap["train_last_failed_step"]) == (2, 4)
    assert snap["checkpoint_step"] is None and snap["rollout_batch_timeouts_total"] == 0
