"""The Silences page's rows: each silence with its matchers as text and its state's colour."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlmodel import Session

from app.models.silence import SilencePublic
from app.silences.matchers import Matcher
from app.silences.store import list_silences, silence_public

STATE_LEVELS = {"active": "warn", "pending": "idle", "expired": "ok"}


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
