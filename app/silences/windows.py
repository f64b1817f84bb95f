"""When a maintenance window is open.

Two forms, kept small on purpose (a cron dialect would be a second language to validate):

- ``once``: open on ``[starts_at, ends_at)``.
- ``weekly``: open every ``weekday`` (0 = Monday ... 6 = Sunday) from ``start_minute``
  minutes after midnight UTC for ``duration_minutes``, for occurrences from ``starts_at`` on
  and while ``ends_at`` (if any) has not passed. An occurrence may run past midnight (Sunday
  23:00 for 3 hours is open on Monday at 01:00).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlmodel import Session, col, or_, select

from app.models.silence import MaintenanceWindow
from app.policy.world import Maintenance

WEEK = timedelta(days=7)


class Recurrence(StrEnum):
    ONCE = "once"
    WEEKLY = "weekly"


def window_is_open(window: MaintenanceWindow, now: datetime) -> bool:
    if now < window.starts_at or (window.ends_at is not None and now >= window.ends_at):
        return False
    if window.recurrence == Recurrence.ONCE:
        return True
    start = last_occurrence_start(window, now)
    duration = timedelta(minutes=window.duration_minutes or 0)
    return start is not None and start <= now < start + duration


def last_occurrence_start(window: MaintenanceWindow, now: datetime) -> datetime | None:
    """The latest weekly occurrence that started at or before ``now`` (None before the first)."""
    if window.weekday is None or window.start_minute is None:
        return None
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    this_week = midnight - timedelta(days=(now.weekday() - window.weekday) % 7)
    start = this_week + timedelta(minutes=window.start_minute)
    if start > now:
        start -= WEEK
    # An occurrence that began before the window existed does not count (created on Monday
    # 10:00 for "Mondays 09:00 for 2h", it is first open next Monday).
    return start if start >= window.starts_at else None


def window_state(window: MaintenanceWindow, now: datetime) -> str:
    """What the listing shows: "open", "scheduled" (waiting for its next opening) or "expired"."""
    if window.ends_at is not None and now >= window.ends_at:
        return "expired"
    return "open" if window_is_open(window, now) else "scheduled"


def open_windows(session: Session, now: datetime) -> list[MaintenanceWindow]:
    """The windows open at ``now``, oldest first."""
    rows = session.exec(
        select(MaintenanceWindow)
        .where(
            MaintenanceWindow.starts_at <= now,
            or_(col(MaintenanceWindow.ends_at).is_(None), col(MaintenanceWindow.ends_at) > now),
        )
        .order_by(col(MaintenanceWindow.id))
    ).all()
    return [row for row in rows if window_is_open(row, now)]


def maintenance_at(session: Session, now: datetime) -> Maintenance:
    """What the policy engine must not judge for silence at ``now`` (its ``World.maintenance``)."""
    return Maintenance(windows=frozenset((r.node, r.job) for r in open_windows(session, now)))
