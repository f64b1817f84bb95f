"""Small builders for policy unit tests: a store fed at 1 Hz and a world at a given time."""

from __future__ import annotations

from collections.abc import Callable

from app.policy.engine import PolicyEngine, _build_index
from app.policy.policy_file import Policy, default_policy
from app.policy.world import Maintenance, ParticipantView, World
from app.series.store import SeriesKey, SeriesStore

T0 = 1_000_000.0
JOB = "job-x"


class Cluster:
    """A store plus participants and node last-seen times that tests drive second by second."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or default_policy()
        self.store = SeriesStore()
        self.participants: dict[tuple[str, str, int], ParticipantView] = {}
        self.node_seen: dict[str, float] = {}
        self.fingerprints: dict[str, dict[str, str]] = {}
        self.maintenance = Maintenance()
        self.now = T0

    def put(
        self, node: str, name: str, value: float, ts: float | None = None, **labels: str
    ) -> None:
        t = self.now if ts is None else ts
        self.store.append(SeriesKey.of(node, name, labels), t, value)
        self.node_seen[node] = max(self.node_seen.get(node, 0.0), t)

    def participant(
        self,
        role: str,
        rank: int,
        node: str,
        *,
        phase: str = "TRAIN",
        step: int = 20,
        heartbeat: float | None = None,
        job: str = JOB,
    ) -> None:
        hb = self.now if heartbeat is None else heartbeat
        self.participants[(job, role, rank)] = ParticipantView(
            job, role, rank, node, phase, step, hb
        )
        self.node_seen[node] = max(self.node_seen.get(node, 0.0), self.now)

    def world(self) -> World:
        return World(
            now=self.now,
            store=self.store,
            participants=list(self.participants.values()),
            node_last_seen=dict(self.node_seen),
            fingerprints=self.fingerprints,
            maintenance=self.maintenance,
        )

    def run(
        self,
        seconds: int,
        each_second: Callable[[Cluster], None],
        engine: PolicyEngine | None = None,
        detector: object | None = None,
    ) -> list:
        """Advance ``seconds`` one second at a time: feed, then tick; returns everything emitted."""
        out: list = []
        for _ in range(seconds):
            self.now += 1.0
            each_second(self)
            world = self.world()
            if engine is not None:
                out.extend(engine.tick(world).decisions)
            elif detector is not None:
                if not hasattr(detector, "_test_index"):
                    detector._test_index = _build_index([detector])  # type: ignore[attr-defined]
                world.index_latest((), detector._test_index)  # type: ignore[attr-defined]
                out.append(detector.run(world))  # type: ignore[attr-defined]
        return out


def first_firing(results: list[list[object]]) -> int | None:
    """The 1-based tick of the first non-empty result, or None if nothing fired."""
    for i, sigs in enumerate(results):
        if sigs:
            return i + 1
    return None
