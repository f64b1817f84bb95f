"""What the policy engine looks at on one tick.

The engine is pure: the server builds a :class:`World` from its live state (the series store,
the participant table kept by ingest, node last-seen times and fingerprints), replay builds one
from a trace. Nothing here touches a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from app.services.series_store import Point, SeriesKey, SeriesStore


@dataclass(frozen=True, slots=True)
class ParticipantView:
    """One training process as the policy sees it (adapted from the Participant rows)."""

    job: str
    role: str
    rank: int
    node: str
    phase: str
    step: int
    last_heartbeat_ts: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job, self.role, self.rank)


@dataclass(slots=True)
class World:
    now: float
    store: SeriesStore
    participants: Sequence[ParticipantView] = ()
    node_last_seen: Mapping[str, float] = field(default_factory=dict)
    fingerprints: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Latest point of every series the detectors read, grouped by metric name: built once per
    # tick (one pass over the store) instead of once per detector.
    latest: dict[str, list[tuple[SeriesKey, Point]]] = field(default_factory=dict)

    def index_latest(self, names: Iterable[str]) -> None:
        wanted = set(names)
        grouped: dict[str, list[tuple[SeriesKey, Point]]] = {n: [] for n in wanted}
        for key, point in self.store.items():
            bucket = grouped.get(key.name)
            if bucket is not None:
                bucket.append((key, point))
        self.latest = grouped

    def series(self, name: str) -> list[tuple[SeriesKey, Point]]:
        return self.latest.get(name, [])

    def jobs_on_node(self, node: str) -> list[str]:
        return sorted({p.job for p in self.participants if p.node == node})

    def job_step(self, job: str) -> int | None:
        steps = [p.step for p in self.participants if p.job == job]
        return max(steps) if steps else None
