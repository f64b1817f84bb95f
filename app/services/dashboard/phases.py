"""The Job page's phase timeline: one lane per participant, a coloured band per phase."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from sqlmodel import Session

from app.models import from_epoch
from app.services.phases import phase_history

TIMELINE_MINUTES = 60
# Colours for the phases of the phase machine (DESIGN.md); anything else is drawn neutral.
KNOWN_PHASES = ("INIT", "PREPARE", "ROLLOUT", "COLLECT", "TRAIN", "EVAL", "SAFE_MODE")


@dataclass(slots=True)
class PhaseBand:
    phase: str
    start: float
    end: float
    left_pct: float
    width_pct: float
    step: int

    @property
    def css(self) -> str:
        return f"ph-{self.phase.lower()}" if self.phase in KNOWN_PHASES else "ph-other"

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(slots=True)
class PhaseLane:
    who: str  # "role/rank"
    bands: list[PhaseBand]

    @property
    def current(self) -> str | None:
        return self.bands[-1].phase if self.bands else None


@dataclass(slots=True)
class PhaseTimeline:
    start: float
    end: float
    lanes: list[PhaseLane]
    phases: list[str] = field(default_factory=list)  # legend, in the order first seen
    truncated: bool = False
    ticks: list[tuple[float, float]] = field(default_factory=list)  # (left %, ts)


def phase_timeline(
    session: Session, *, job: str, now: float, minutes: int = TIMELINE_MINUTES
) -> PhaseTimeline:
    """Bands over the last ``minutes``; raises ``NotFound`` for an unknown job."""
    end = now
    start = now - minutes * 60
    history = phase_history(session, job=job, now=from_epoch(now), since=from_epoch(start))
    span = end - start
    changes: dict[str, list[tuple[float, str, int]]] = defaultdict(list)
    legend: list[str] = []
    for t in history.data:
        changes[f"{t.role}/{t.rank}"].append((t.at.timestamp(), t.phase, t.step))
        if t.phase not in legend:
            legend.append(t.phase)
    lanes: list[PhaseLane] = []
    for who in sorted(changes, key=_lane_order):
        points = changes[who]
        bands: list[PhaseBand] = []
        for i, (at, phase, step) in enumerate(points):
            band_start = max(at, start)
            band_end = min(points[i + 1][0], end) if i + 1 < len(points) else end
            if band_end <= band_start:
                continue  # wholly before the window (superseded inside it) or in the future
            bands.append(
                PhaseBand(
                    phase=phase,
                    start=band_start,
                    end=band_end,
                    left_pct=round((band_start - start) / span * 100, 3),
                    width_pct=round((band_end - band_start) / span * 100, 3),
                    step=step,
                )
            )
        lanes.append(PhaseLane(who=who, bands=bands))
    tick_every = timedelta(minutes=10).total_seconds()
    first_tick = (start // tick_every + 1) * tick_every
    ticks = []
    ts = first_tick
    while ts < end:
        ticks.append((round((ts - start) / span * 100, 3), ts))
        ts += tick_every
    return PhaseTimeline(
        start=start,
        end=end,
        lanes=lanes,
        phases=legend,
        truncated=history.truncated,
        ticks=ticks,
    )


def _lane_order(who: str) -> tuple[int, str, int]:
    role, _, rank = who.rpartition("/")
    return (0 if role == "trainer" else 1, role, int(rank) if rank.isdigit() else 0)
