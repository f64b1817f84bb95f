"""When a job is steady enough for warm standbys to start (recovery.supervision.standby)."""

from __future__ import annotations

from recovery.supervision.standby import reports_steadily


def test_a_process_past_its_start_reports_steadily() -> None:
    beat = {"phase": "TRAIN", "pid": 7, "ts": 100.0}
    assert reports_steadily(beat)
    assert reports_steadily(beat, pid=7)
    assert reports_steadily(beat, max_age=2.0, now=101.0)


def test_starting_missing_foreign_or_stale_heartbeats_do_not() -> None:
    assert not reports_steadily(None)
    assert not reports_steadily({})
    assert not reports_steadily({"phase": "INIT", "pid": 7, "ts": 100.0})
    assert not reports_steadily({"phase": "STARTING", "pid": 7, "ts": 100.0})
    # the launcher's process started, but the heartbeat is its predecessor's
    assert not reports_steadily({"phase": "TRAIN", "pid": 6, "ts": 100.0}, pid=7)
    # a dead process's last heartbeat goes stale
    assert not reports_steadily({"phase": "TRAIN", "pid": 7, "ts": 100.0}, max_age=2.0, now=102.5)
