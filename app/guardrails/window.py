"""Sliding windows over past action times, and the backoff between them.

Pure functions over timestamps: the callers read the times from the action rows themselves (the
outbox is the record of what automation did), so there is no counter to keep in step with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

# 2**16 times any base is beyond every window: the exponent stops growing there.
_MAX_DOUBLINGS = 16


def window_start(now: datetime, seconds: float, *, not_before: datetime | None = None) -> datetime:
    """Where a window of ``seconds`` ending at ``now`` starts; ``not_before`` (a breaker reset)
    cuts it shorter, so what happened before a person's reset is not counted again."""
    start = now - timedelta(seconds=seconds)
    return max(start, not_before) if not_before is not None else start


def in_window(times: Iterable[datetime], *, now: datetime, seconds: float) -> list[datetime]:
    """The times within the window (start excluded, ``now`` included), oldest first."""
    start = window_start(now, seconds)
    return sorted(t for t in times if start < t <= now)


def backoff_until(
    previous: Iterable[datetime], *, now: datetime, base_seconds: float
) -> datetime | None:
    """When the next action may run after ``previous`` ones (in the window), or None if now.

    The wait doubles with each earlier action: base after the first, 2 x base after the
    second, and so on; ``base_seconds`` 0 means no backoff.
    """
    done = sorted(previous)
    if base_seconds <= 0 or not done:
        return None
    wait = base_seconds * 2 ** min(len(done) - 1, _MAX_DOUBLINGS)
    until = done[-1] + timedelta(seconds=wait)
    return until if until > now else None


def describe_seconds(seconds: float) -> str:
    """A window's length as people say it: ``30 min``, ``2 h``, ``45 s``."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds >= 120 and seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"
