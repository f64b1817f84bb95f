"""Sliding windows and backoff over action times (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.guardrails.window import backoff_until, describe_seconds, in_window, window_start

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_window_keeps_times_after_its_start_up_to_now_oldest_first() -> None:
    times = [at(50), at(0), at(-1), at(100), at(101)]
    # window of 100 s ending at t=100 starts at t=0 (excluded): 50 and 100 are in it.
    assert in_window(times, now=at(100), seconds=100) == [at(50), at(100)]
    # it slides: a minute later 50 has left it
    assert in_window(times, now=at(160), seconds=100) == [at(100), at(101)]


def test_a_reset_cuts_the_window_short() -> None:
    assert window_start(at(100), 100) == at(0)
    assert window_start(at(100), 100, not_before=at(70)) == at(70)
    assert window_start(at(100), 100, not_before=at(-30)) == at(0)


def test_backoff_doubles_with_each_earlier_action_and_ends() -> None:
    assert backoff_until([], now=at(0), base_seconds=30) is None
    assert backoff_until([at(0)], now=at(10), base_seconds=0) is None  # off
    assert backoff_until([at(0)], now=at(10), base_seconds=30) == at(30)
    assert backoff_until([at(0), at(40)], now=at(50), base_seconds=30) == at(100)
    assert backoff_until([at(0), at(40), at(100)], now=at(150), base_seconds=30) == at(220)
    assert backoff_until([at(0)], now=at(30), base_seconds=30) is None  # waited enough
    # many earlier actions: the exponent stops growing instead of overflowing
    many = [at(i) for i in range(200)]
    assert backoff_until(many, now=at(200), base_seconds=1) == at(199 + 2**16)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(1800, "30 min"), (7200, "2 h"), (45, "45 s"), (90, "90 s"), (600, "10 min")],
)
def test_window_lengths_read_as_people_say_them(seconds: float, words: str) -> None:
    assert describe_seconds(seconds) == words
