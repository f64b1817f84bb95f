"""The Silences page's rows: each silence with its matchers as text and its state's colour, and
each maintenance window with what it covers and when it is open, in words."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from app.silences.matchers import Matcher
from app.silences.public import MaintenanceWindowPublic, SilencePublic
from app.silences.store import list_silences, list_windows, silence_public, window_public

STATE_LEVELS = {"active": "warn", "pending": "idle", "expired": "ok"}
WINDOW_LEVELS = {"open": "warn", "scheduled": "idle", "expired": "ok"}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@dataclass(frozen=True, slots=True)
class SilenceRow:
    silence: SilencePublic
    matchers: str
    level: str

    @property
    def expirable(self) -> bool:
        return self.silence.state != "expired"


def silence_rows(session: Session, *, now: datetime, limit: int = 200) -> list[SilenceRow]:
    """Newest first, expired ones included (the state column says which)."""
    rows = []
    for row in list_silences(session, now=now)[:limit]:
        public = silence_public(row, now)
        text = ", ".join(str(Matcher.parse(m)) for m in row.matchers)
        rows.append(SilenceRow(public, text, STATE_LEVELS.get(public.state, "idle")))
    return rows


@dataclass(frozen=True, slots=True)
class WindowRow:
    window: MaintenanceWindowPublic
    covers: str  # "node gpu-03", "job grpo-a", "job grpo-a on node gpu-03"
    when: str  # "every Sunday 23:00 UTC for 180 min" or empty for a one-off (from/until say it)
    level: str


def window_rows(session: Session, *, now: datetime, limit: int = 200) -> list[WindowRow]:
    """Newest first, expired ones included (the state column says which)."""
    rows = []
    for row in list_windows(session)[:limit]:
        public = window_public(row, now)
        covers = " on ".join(
            f"{what} {name}" for what, name in (("job", row.job), ("node", row.node)) if name
        )
        when = ""
        if row.weekday is not None and row.start_minute is not None:
            hh, mm = divmod(row.start_minute, 60)
            when = (
                f"every {WEEKDAYS[row.weekday]} {hh:02d}:{mm:02d} UTC "
                f"for {row.duration_minutes} min"
            )
        rows.append(WindowRow(public, covers, when, WINDOW_LEVELS.get(public.state, "idle")))
    return rows
