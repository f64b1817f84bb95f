"""The Job page's phase timeline: one lane per participant, a coloured band per phase."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from sqlmodel import Session

from app.cluster.phase_history import phase_history
from app.models import from_epoch

TIMELINE_MINUTES = 60
MIN_SPAN_SECONDS = 60.0
# Tick spacing: the first that gives at most ~7 ticks over the drawn span.
TICK_STEPS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
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
    tick_format: str = "%H:%M"

    @property
    def span_label(self) -> str:
        minutes = (self.end - self.start) / 60
        return f"{minutes:.0f} min" if minutes >= 2 else f"{self.end - self.start:.0f} s"


def phase_timeline(
    session: Session, *, job: str, now: float, minutes: int = TIMELINE_MINUTES
) -> PhaseTimeline:
    """Bands over the last ``minutes``; raises ``NotFound`` for an unknown job.

    A job younger than the window is drawn from its first transition (at least a minute), so a
    fresh job's phases are not squeezed into the right edge of an hour.
    """
    end = now
    horizon = now - minutes * 60
    history = phase_history(session, job=job, now=from_epoch(now), since=from_epoch(horizon))
    first = min((t.at.timestamp() for t in history.data), default=horizon)
    start = min(max(horizon, first), end - MIN_SPAN_SECONDS)
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
    tick_every = next((t for t in TICK_STEPS if span / t <= 7), TICK_STEPS[-1])
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
        tick_format="%H:%M" if tick_every >= 60 else "%H:%M:%S",
    )


def _lane_order(who: str) -> tuple[int, str, int]:
    role, _, rank = who.rpartition("/")
    return (0 if role == "trainer" else 1, role, int(rank) if rank.isdigit() else 0)
