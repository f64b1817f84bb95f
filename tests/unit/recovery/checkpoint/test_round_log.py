"""An outage's aborted rounds: one warning when the streak starts, one a minute while it lasts,
one when a round commits again; each round's own line at debug."""

from __future__ import annotations

import logging

import pytest

from recovery.checkpoint._round_log import AbortStreak

LOG = logging.getLogger("test.round_log")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_streak_of_aborts_warns_once_a_minute_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    streak = AbortStreak(LOG, lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="test.round_log")
    for round_id in range(1, 31):  # 30 rounds, one every 5 s: 150 s of outage
        streak.aborted(round_id, "rank 1 did not answer prepare")
        now[0] += 5.0
    streak.committed(31, "v(40, 12)")
    assert _warnings(caplog) == [
        "round 1 aborted: rank 1 did not answer prepare",
        "13 rounds aborted since round 1 (60 s ago); the last, round 13: rank 1 did not answer "
        "prepare",
        "25 rounds aborted since round 1 (120 s ago); the last, round 25: rank 1 did not answer "
        "prepare",
        "round 31 committed: global version v(40, 12), after 30 aborted rounds since round 1 "
        "(150 s)",
    ]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 29 and debug[0] == "round 2 aborted: rank 1 did not answer prepare"


def test_a_commit_without_aborts_is_an_info_line_and_a_new_streak_warns_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    streak = AbortStreak(LOG, lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.round_log")
    streak.committed(1, "v1")
    streak.aborted(2, "lease lost")
    streak.committed(3, "v3")
    streak.aborted(4, "timeout")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "round 1 committed: global version v1"),
        ("WARNING", "round 2 aborted: lease lost"),
        (
            "WARNING",
            "round 3 committed: global version v3, after 1 aborted rounds since round 2 (0 s)",
        ),
        ("WARNING", "round 4 aborted: timeout"),
    ]
