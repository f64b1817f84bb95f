"""Creating, listing and expiring silences and maintenance windows.

The REST routes, the dashboard and the CLI all come here, so a bad value gets the same
``InvalidInput`` (422, the message naming it) wherever it was typed, and nothing is stored.
Every change writes its audit row in the caller's transaction. Expiring moves the end to now
rather than deleting: timelines name silences by id, and the row must still say what it was.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, select

from app.auth.audit import record_audit
from app.core.db import begin_write
from app.core.errors import Conflict, InvalidInput, NotFound
from app.models.silence import MaintenanceWindow, Silence
from app.silences.matchers import MAX_VALUE_CHARS, parse_matchers
from app.silences.public import (
    MaintenanceWindowCreate,
    MaintenanceWindowPublic,
    SilenceCreate,
    SilencePublic,
)
from app.silences.windows import Recurrence, window_state


def _aware(name: str, value: datetime | None) -> datetime | None:
    # A naive time is almost always local time typed by a person: refuse it rather than guess.
    if value is None:
        return None
    if value.tzinfo is None:
        raise InvalidInput(f"{name}={value.isoformat()} has no time zone (add Z or +00:00)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(
            f"{name}={value.isoformat()} is outside the years 1..9999 in UTC"
        ) from None


def _plus(name: str, start: datetime, minutes: float) -> datetime:
    try:
        return start + timedelta(minutes=minutes)
    except OverflowError:
        raise InvalidInput(
            f"{name}: {start.isoformat()} plus {minutes:g} min is past the year 9999"
        ) from None


def _check_span(what: str, length: timedelta, max_hours: float) -> None:
    if length > timedelta(hours=max_hours):
        hours = length.total_seconds() / 3600
        raise InvalidInput(
            f"{what} lasts {hours:g} h, longer than the maximum of {max_hours:g} h "
            "(setting silences.max_duration_hours)"
        )


def silence_state(row: Silence, now: datetime) -> str:
    if now >= row.ends_at:
        return "expired"
    return "pending" if now < row.starts_at else "active"


def create_silence(
    session: Session,
    body: SilenceCreate,
    *,
    author: str,
    max_hours: float,
    now: datetime,
    max_regex_chars: int = MAX_VALUE_CHARS,
) -> Silence:
    """``max_hours`` and ``max_regex_chars``: the ``silences`` settings of that name."""
    matchers = parse_matchers(
        [m.model_dump() for m in body.matchers], max_regex_chars=max_regex_chars
    )
    starts = _aware("starts_at", body.starts_at) or now
    ends = _aware("ends_at", body.ends_at)
    if (ends is None) == (body.duration_minutes is None):
        raise InvalidInput("give either ends_at or duration_minutes (exactly one)")
    if ends is None:
        assert body.duration_minutes is not None
        if not math.isfinite(body.duration_minutes) or body.duration_minutes <= 0:
            raise InvalidInput(f"duration_minutes={body.duration_minutes:g} must be above 0")
        # Checked before the addition, which overflows for absurd values.
        _check_span("the silence", timedelta(minutes=min(body.duration_minutes, 1e9)), max_hours)
        ends = _plus("duration_minutes", starts, body.duration_minutes)
    if ends <= starts:
        raise InvalidInput(
            f"ends_at={ends.isoformat()} is not after starts_at={starts.isoformat()}"
        )
    _check_span("the silence", ends - starts, max_hours)
    row = Silence(
        matchers=[m.to_dict() for m in matchers],
        starts_at=starts,
        ends_at=ends,
        author=author,
        comment=body.comment,
        stops_actions=body.stops_actions,
        created_at=now,
    )
    session.add(row)
    session.flush()
    record_audit(
        session,
        actor=author,
        action="silence.create",
        target=f"silence:{row.id}",
        detail={
            "matchers": [str(m) for m in matchers],
            "starts_at": starts.isoformat(),
            "ends_at": ends.isoformat(),
            "stops_actions": row.stops_actions,
            "comment": row.comment,
        },
    )
    return row


def list_silences(session: Session, *, now: datetime, active_only: bool = False) -> list[Silence]:
    """Newest first; ``active_only`` leaves out the expired ones (pending ones stay)."""
    query = select(Silence)
    if active_only:
        query = query.where(Silence.ends_at > now)
    return list(session.exec(query.order_by(col(Silence.id).desc())).all())


def expire_silence(session: Session, silence_id: int, *, actor: str, now: datetime) -> Silence:
    begin_write(session)  # two operators ending it at once: the second finds it ended (409)
    row = session.get(Silence, silence_id, with_for_update=True)
    if row is None:
        raise NotFound(f"silence {silence_id} does not exist")
    _end_now(session, row, "silence", silence_state(row, now) == "expired", actor=actor, now=now)
    return row


def _end_now(
    session: Session,
    row: Silence | MaintenanceWindow,
    kind: str,
    expired: bool,
    *,
    actor: str,
    now: datetime,
) -> None:
    """End a silence or a maintenance window now (the row stays: timelines name it), audited as
    ``<kind>.expire``; one that already ended is a conflict, and nothing changes."""
    name = f"{kind.replace('_', ' ')} {row.id}"
    # Ended by someone already, even if its end is still ahead of our ``now``: two operators'
    # requests race, and the one that waited for the row lock may have read the clock first.
    if expired or row.expired_by is not None:
        ended = row.ends_at.isoformat() if row.ends_at else "?"
        raise Conflict(f"{name} already expired at {ended}")
    row.ends_at, row.expired_by = now, actor
    # One expired before it began: keep starts_at <= ends_at.
    row.starts_at = min(row.starts_at, now)
    record_audit(session, actor=actor, action=f"{kind}.expire", target=f"{kind}:{row.id}")


def silence_public(row: Silence, now: datetime) -> SilencePublic:
    assert row.id is not None
    return SilencePublic(
        id=row.id,
        matchers=row.matchers,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        author=row.author,
        comment=row.comment,
        stops_actions=row.stops_actions,
        created_at=row.created_at,
        expired_by=row.expired_by,
        state=silence_state(row, now),
    )


def _start_minute(text: str | None) -> int:
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text or "")
    if m is None or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise InvalidInput(f"start_time={text!r} must be HH:MM (UTC, 00:00 to 23:59)")
    return int(m.group(1)) * 60 + int(m.group(2))


def _window_row(
    body: MaintenanceWindowCreate, *, author: str, max_hours: float, now: datetime
) -> MaintenanceWindow:
    if not body.node and not body.job:
        raise InvalidInput("a maintenance window names a node or a job (neither given)")
    if body.recurrence not in set(Recurrence):
        allowed = ", ".join(r.value for r in Recurrence)
        raise InvalidInput(f"recurrence={body.recurrence!r} is not one of: {allowed}")
    starts = _aware("starts_at", body.starts_at) or now
    ends = _aware("ends_at", body.ends_at)
    if ends is not None and ends <= starts:
        raise InvalidInput(
            f"ends_at={ends.isoformat()} is not after starts_at={starts.isoformat()}"
        )
    row = MaintenanceWindow(
        node=body.node or None,
        job=body.job or None,
        recurrence=body.recurrence,
        starts_at=starts,
        ends_at=ends,
        author=author,
        comment=body.comment,
        created_at=now,
    )
    if body.recurrence == Recurrence.ONCE:
        if ends is None:
            raise InvalidInput("a one-off maintenance window needs ends_at")
        _check_span("the maintenance window", ends - starts, max_hours)
        return row
    if body.weekday is None or not 0 <= body.weekday <= 6:
        raise InvalidInput(f"weekday={body.weekday!r} must be 0 (Monday) to 6 (Sunday)")
    if body.duration_minutes is None or body.duration_minutes <= 0:
        raise InvalidInput(f"duration_minutes={body.duration_minutes!r} must be above 0")
    _check_span("each occurrence", timedelta(minutes=min(body.duration_minutes, 1e9)), max_hours)
    # An occurrence of a week or more would never close.
    if body.duration_minutes >= 7 * 24 * 60:
        raise InvalidInput(f"duration_minutes={body.duration_minutes} must be under a week")
    row.weekday, row.duration_minutes = body.weekday, body.duration_minutes
    row.start_minute = _start_minute(body.start_time)
    return row


def create_window(
    session: Session,
    body: MaintenanceWindowCreate,
    *,
    author: str,
    max_hours: float,
    now: datetime,
) -> MaintenanceWindow:
    row = _window_row(body, author=author, max_hours=max_hours, now=now)
    session.add(row)
    session.flush()
    record_audit(
        session,
        actor=author,
        action="maintenance_window.create",
        target=f"maintenance_window:{row.id}",
        detail=body.model_dump(mode="json", exclude_none=True),
    )
    return row


def list_windows(session: Session) -> list[MaintenanceWindow]:
    query = select(MaintenanceWindow).order_by(col(MaintenanceWindow.id).desc())
    return list(session.exec(query).all())


def expire_window(
    session: Session, window_id: int, *, actor: str, now: datetime
) -> MaintenanceWindow:
    begin_write(session)
    row = session.get(MaintenanceWindow, window_id, with_for_update=True)
    if row is None:
        raise NotFound(f"maintenance window {window_id} does not exist")
    expired = window_state(row, now) == "expired"
    _end_now(session, row, "maintenance_window", expired, actor=actor, now=now)
    return row


def window_public(row: MaintenanceWindow, now: datetime) -> MaintenanceWindowPublic:
    assert row.id is not None
    return MaintenanceWindowPublic(
        id=row.id,
        node=row.node,
        job=row.job,
        recurrence=row.recurrence,
        starts_at=row.starts_at,
        ends_at=row.ends_at,
        weekday=row.weekday,
        start_minute=row.start_minute,
        duration_minutes=row.duration_minutes,
        author=row.author,
        comment=row.comment,
        created_at=row.created_at,
        expired_by=row.expired_by,
        state=window_state(row, now),
    )
