"""The Job page's goodput panel and the overview's ETTR tiles: the ledger laid out for HTML
(percent widths for the waterfall and the ETTR bars, the tiles' level)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlmodel import Session

from app.core.config import Settings
from app.goodput.breakdown import SEGMENTS
from app.goodput.public import IncidentGoodput, JobGoodput
from app.goodput.queries import cluster_ettr
from app.goodput.report import assumption_rows, duration

#: ETTR at or above this is healthy, below ``WARN_BELOW`` critical (RobustRL: role-local
#: recovery > 0.80, whole-job restart ~0.60; our target 0.90).
OK_FROM = 0.90
WARN_BELOW = 0.80
WINDOWS = {"24h": "last 24 h", "7d": "last 7 days"}


def level(ettr: float) -> str:
    return "ok" if ettr >= OK_FROM else ("warn" if ettr >= WARN_BELOW else "bad")


@dataclass(slots=True)
class WaterfallBar:
    segment: str
    seconds: float
    left_pct: float
    width_pct: float
    label: str


@dataclass(slots=True)
class WaterfallRow:
    incident: IncidentGoodput
    lost_label: str
    bars: list[WaterfallBar] = field(default_factory=list)


@dataclass(slots=True)
class EttrBar:
    start: datetime
    end: datetime
    ettr: float
    height_pct: float
    level: str


@dataclass(slots=True)
class GoodputPanel:
    window: str
    window_label: str
    ledger: JobGoodput
    level: str
    waterfall: list[WaterfallRow]
    bars: list[EttrBar]
    lost_label: str
    assumptions: list[tuple[str, str]]
    segments: tuple[str, ...] = SEGMENTS


def goodput_panel(ledger: JobGoodput, *, window: str) -> GoodputPanel:
    """Waterfall rows share one scale (the costliest incident is full width), so the rows
    compare at a glance; each row's segments are laid end to end in time order."""
    longest = max((i.lost_seconds for i in ledger.incidents), default=0.0)
    rows = []
    for inc in sorted(ledger.incidents, key=lambda i: i.fault_at):
        row = WaterfallRow(inc, duration(inc.lost_seconds))
        left = 0.0
        for seg in SEGMENTS:
            secs = inc.segments.get(seg, 0.0)
            width = 100.0 * secs / longest if longest > 0 else 0.0
            if secs > 0:
                row.bars.append(
                    WaterfallBar(seg, secs, round(left, 3), round(width, 3), duration(secs))
                )
            left += width
        rows.append(row)
    bars = [
        EttrBar(p.start, p.end, p.ettr, round(100.0 * p.ettr, 2), level(p.ettr))
        for p in ledger.series
    ]
    return GoodputPanel(
        window=window,
        window_label=WINDOWS.get(window, window),
        ledger=ledger,
        level=level(ledger.ettr),
        waterfall=rows,
        bars=bars,
        lost_label=duration(ledger.lost_seconds),
        assumptions=assumption_rows(ledger),
    )


@dataclass(slots=True)
class ClusterTile:
    window: str
    label: str
    ettr: float
    jobs: int
    gpu_hours_lost: float
    level: str


def cluster_tiles(session: Session, *, now: datetime, settings: Settings) -> list[ClusterTile]:
    """The overview's cluster ETTR over the last 24 h and the last 7 days."""
    out = []
    for window, span in (("24h", timedelta(hours=24)), ("7d", timedelta(days=7))):
        ettr, jobs, lost = cluster_ettr(
            session, since=now - span, until=now, now=now, settings=settings
        )
        out.append(ClusterTile(window, WINDOWS[window], ettr, jobs, lost, level(ettr)))
    return out
