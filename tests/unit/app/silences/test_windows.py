from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.models.silence import MaintenanceWindow
from app.silences.windows import window_is_open, window_state

MONDAY = datetime(2026, 11, 30, tzinfo=UTC)  # a Monday, 00:00


def weekly(weekday: int, hhmm: tuple[int, int], minutes: int, **kw: object) -> MaintenanceWindow:
    return MaintenanceWindow(
        node="n1",
        recurrence="weekly",
        starts_at=kw.pop("starts_at", MONDAY - timedelta(days=30)),
        ends_at=kw.pop("ends_at", None),
        weekday=weekday,
        start_minute=hhmm[0] * 60 + hhmm[1],
        duration_minutes=minutes,
        author="ops",
    )


def at(days: float, hours: float = 0, minutes: float = 0) -> datetime:
    return MONDAY + timedelta(days=days, hours=hours, minutes=minutes)


def test_one_off_window_is_open_on_its_half_open_range() -> None:
    w = MaintenanceWindow(node="n1", starts_at=at(0, 9), ends_at=at(0, 11), author="ops")
    assert not window_is_open(w, at(0, 8, 59))
    assert window_is_open(w, at(0, 9))
    assert window_is_open(w, at(0, 10, 59))
    assert not window_is_open(w, at(0, 11))
    assert (window_state(w, at(0, 8)), window_state(w, at(0, 10)), window_state(w, at(0, 12))) == (
        "scheduled", "open", "expired",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("when", "open_"),
    [
        (at(2, 2, 59), False),  # Wednesday before 03:00
        (at(2, 3), True),
        (at(2, 4, 29), True),
        (at(2, 4, 30), False),
        (at(9, 3, 10), True),  # next Wednesday
        (at(3, 3, 10), False),  # Thursday
    ],
)
def test_weekly_window(when: datetime, open_: bool) -> None:
    assert window_is_open(weekly(2, (3, 0), 90), when) is open_


def test_weekly_occurrence_runs_past_midnight() -> None:
    sunday_late = weekly(6, (23, 0), 180)
    assert window_is_open(sunday_late, at(7, 1, 30))  # Monday 01:30 of the next week
    assert not window_is_open(sunday_late, at(7, 2, 0))


def test_weekly_window_counts_no_occurrence_before_it_began_or_after_it_ended() -> None:
    created_mid_occurrence = weekly(0, (9, 0), 120, starts_at=at(0, 10))
    assert not window_is_open(created_mid_occurrence, at(0, 10, 30))
    assert window_is_open(created_mid_occurrence, at(7, 10, 30))
    ended = weekly(0, (9, 0), 120, ends_at=at(1))
    assert window_is_open(ended, at(0, 9, 30))
    assert not window_is_open(ended, at(7, 9, 30))
    assert window_state(ended, at(7, 9, 30)) == "expired"
    assert window_state(weekly(0, (9, 0), 120), at(0, 12)) == "scheduled"
