from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.core.errors import InvalidInput
from app.goodput.window import parse_instant, parse_window

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_durations_and_instants() -> None:
    assert parse_instant("since", "7d", now=NOW) == NOW - timedelta(days=7)
    assert parse_instant("since", " 90m ", now=NOW) == NOW - timedelta(minutes=90)
    assert parse_instant("since", "1.5h", now=NOW) == NOW - timedelta(hours=1.5)
    assert parse_instant("until", "2026-12-01T08:00:00+08:00", now=NOW) == datetime(
        2026, 12, 1, 0, 0, tzinfo=UTC
    )
    assert parse_window(None, None, now=NOW) == (NOW - timedelta(days=1), NOW)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("soon", "since 'soon' is neither a duration"),
        ("7", "since '7' is neither"),
        ("-3d", "since '-3d' is neither"),
        ("0h", "since '0h' is not a positive duration"),
        ("99999999999d", "since '99999999999d' reaches before the year 1"),
        ("0001-01-01T00:00:00+14:00", "is outside the years 1..9999 in UTC"),
        ("2026-12-01T08:00:00", "since '2026-12-01T08:00:00' must carry a time zone"),
    ],
)
def test_bad_values_are_named(text: str, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        parse_instant("since", text, now=NOW)
