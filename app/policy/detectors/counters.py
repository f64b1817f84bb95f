"""Cumulative counters (XIDs, ECC errors, failed steps, write errors): their increases between
ticks, grouped into episodes that keep a signal up for a hold time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.policy.detectors.base import Detector, subject_of
from app.policy.signals import Evidence, FaultKind, FaultSignal
from app.policy.world import World
from app.series.store import Point, SeriesKey


@dataclass(slots=True)
class Episode:
    first_ts: float
    last_ts: float
    increase: float


class CounterWatch:
    """Finds increases of cumulative counters between ticks.

    The first value of a series is a baseline, unless its node was already reporting before
    (then a series that appears with a positive value is an increase from zero).
    """

    def __init__(self) -> None:
        self._last: dict[SeriesKey, tuple[float, float]] = {}
        self.episodes: dict[SeriesKey, Episode] = {}

    def observe(self, key: SeriesKey, point: Point, *, node_known: bool, hold: float) -> float:
        prev = self._last.get(key)
        self._last[key] = (point.ts, point.value)
        if prev is None:
            increase = point.value if node_known and point.value > 0 else 0.0
        elif point.ts <= prev[0]:
            return 0.0
        else:
            delta = point.value - prev[1]
            increase = delta if delta >= 0 else point.value  # reset: count from zero
        if increase > 0:
            ep = self.episodes.get(key)
            if ep is None or point.ts - ep.last_ts > hold:
                self.episodes[key] = Episode(point.ts, point.ts, increase)
            else:
                ep.last_ts = point.ts
                ep.increase += increase
        return increase

    def episodes_of(
        self,
        world: World,
        name: str,
        nodes: NodeMemory,
        hold: float,
        *,
        on_increase: Callable[[SeriesKey, float], None] | None = None,
    ) -> list[tuple[SeriesKey, Episode]]:
        """Observe the series of ``name`` that changed this tick; return the live episodes."""
        for key, point in world.series(name):
            inc = self.observe(key, point, node_known=nodes.known(key.node), hold=hold)
            if inc > 0 and on_increase is not None:
                on_increase(key, inc)
        out = []
        for key in [k for k in self.episodes if k.name == name]:
            ep = self.active(key, world.now, hold)
            if ep is not None:
                out.append((key, ep))
        return out

    def active(self, key: SeriesKey, now: float, hold: float) -> Episode | None:
        ep = self.episodes.get(key)
        if ep is None:
            return None
        if now - ep.last_ts > hold:
            del self.episodes[key]
            return None
        return ep


class NodeMemory:
    """Which nodes had reported before this tick (see CounterWatch)."""

    def __init__(self) -> None:
        self._known: set[str] = set()
        self._pending: set[str] = set()

    def known(self, node: str) -> bool:
        self._pending.add(node)
        return node in self._known

    def commit(self, world: World) -> None:
        self._known |= self._pending
        self._known.update(world.node_last_seen)
        self._pending.clear()


def counter_signal(
    detector: Detector, world: World, kind: FaultKind, key: SeriesKey, ep: Episode, window: float
) -> FaultSignal:
    """The signal of a live episode of a counter whose every rise is a fault."""
    evidence = Evidence(
        metric=key.name,
        values=((ep.first_ts, ep.increase),),
        window_seconds=window,
        threshold=0.0,
        detail=f"{key.name} rose by {ep.increase:g}",
    )
    return detector.signal(
        world, kind, subject_of(key), evidence, since=ep.first_ts, newest_at=ep.last_ts
    )
