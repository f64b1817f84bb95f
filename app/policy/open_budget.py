"""How many incidents about one node the engine opens per minute; beyond it, one about the flood.

A node can report anything its token lets it, and every incident costs rows, a plan and an alert
in the tick that opens it. The ingest quotas bound what a node holds; this bounds what the
policy makes of it. Per node, at most ``per_minute`` incidents open in any rolling minute. Faults
beyond the budget are held: they stay unopened (the detectors keep reporting them, so each is
opened later when the budget allows, heaviest first; within the minute at most a quarter of the
budget per 15 s) and the node gets one ``incident_flood`` incident saying how many are held,
which stays open while any is held and resolves after the quiet period like any other.

Only node-scoped signals count (a subject with a node); a job-wide signal names no node to
charge, and what a node reports about jobs is bounded by the ingest quotas. Pure like the
engine: the budget remembers open times in the engine's clock (``world.now``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier

WINDOW_SECONDS = 60.0
# Within the minute, at most a quarter of the budget per quarter of it: opening 20 incidents
# (rows, plans, alerts) in one transaction held the database for every node's ingest for a
# second or two on a loaded host; spread out, the same 20 cost four short ones.
SPREAD = 4


@dataclass(frozen=True, slots=True)
class Held:
    """One tick's verdict: the incident keys held back, and per node how many."""

    keys: frozenset[str]
    per_node: dict[str, int]


class NodeOpenBudget:
    """Per node, the times of the incidents opened in the last minute."""

    def __init__(self, per_minute: int | None) -> None:
        if per_minute is not None and per_minute < 1:
            raise ValueError(f"incidents per minute must be at least 1, got {per_minute}")
        self.per_minute = per_minute
        self._opened: dict[str, deque[float]] = {}
        self._holding_since: dict[str, float] = {}  # node -> when its faults were first held

    def _remaining(self, node: str, now: float) -> int:
        assert self.per_minute is not None
        per_quarter = -(-self.per_minute // SPREAD)  # ceil
        times = self._opened.get(node)
        if times is None:
            return per_quarter
        while times and times[0] <= now - WINDOW_SECONDS:
            times.popleft()
        if not times:
            del self._opened[node]
            return per_quarter
        recent = sum(1 for t in times if t > now - WINDOW_SECONDS / SPREAD)
        return min(self.per_minute - len(times), per_quarter - recent)

    def hold(self, candidates: Iterable[FaultSignal], now: float) -> Held:
        """Which of the signals that would open an incident this tick must wait: per node,
        those beyond its budget, the lightest first (a heavy fault is never held behind light
        ones of the same node)."""
        if self.per_minute is None:
            return Held(frozenset(), {})
        by_node: dict[str, list[FaultSignal]] = {}
        for sig in candidates:
            node = sig.subject.node
            if node is not None and sig.kind is not FaultKind.INCIDENT_FLOOD:
                by_node.setdefault(node, []).append(sig)
        keys: set[str] = set()
        per_node: dict[str, int] = {}
        for node, sigs in by_node.items():
            room = self._remaining(node, now)
            if len(sigs) <= room:
                continue
            ranked = sorted(sigs, key=lambda s: -s.suggested_tier.rank)  # stable
            waiting = ranked[max(room, 0) :]
            keys.update(s.incident_key for s in waiting)
            per_node[node] = len(waiting)
        for node in [n for n in self._holding_since if n not in per_node]:
            del self._holding_since[node]
        for node in per_node:
            self._holding_since.setdefault(node, now)
        return Held(frozenset(keys), per_node)

    def spend(self, node: str, now: float) -> None:
        """An incident about ``node`` was opened at ``now``."""
        if self.per_minute is not None:
            self._opened.setdefault(node, deque()).append(now)

    def flood_signals(self, held: Held, now: float) -> list[FaultSignal]:
        """One ``incident_flood`` signal per node with faults held back this tick."""
        out = []
        for node, count in sorted(held.per_node.items()):
            out.append(
                FaultSignal(
                    kind=FaultKind.INCIDENT_FLOOD,
                    subject=Subject(node=node),
                    evidence=Evidence(
                        metric=None,
                        threshold=float(self.per_minute or 0),
                        window_seconds=WINDOW_SECONDS,
                        detail=(
                            f"{count} more incident(s) about node {node} held back: more than "
                            f"{self.per_minute} a minute (node_quotas.incidents_per_minute); "
                            "they open as the budget allows, heaviest first"
                        ),
                    ),
                    suggested_tier=Tier.MEDIUM,
                    detected_at=now,
                    since=self._holding_since.get(node, now),
                    extra={"held": count},
                )
            )
        return out
