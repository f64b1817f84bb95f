"""Incidents opened per node per minute (app/policy/open_budget.py through the engine): beyond the
budget one ``incident_flood`` incident per node, the rest held and opened later, heaviest first;
other nodes keep their own budget."""

from __future__ import annotations

from app.policy.detectors import Detector
from app.policy.engine import DecisionType, PolicyEngine
from app.policy.policy_file import default_policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.policy.world import World
from app.series.store import SeriesStore


class Reported(Detector):
    """Reports whatever the test puts in ``signals`` (the node's faults)."""

    def __init__(self) -> None:
        self.signals: list[FaultSignal] = []

    def run(self, world: World) -> list[FaultSignal]:
        return list(self.signals)


def fault(node: str, rank: int, tier: Tier = Tier.LIGHT, kind: FaultKind = FaultKind.STEP_FAILED):
    return FaultSignal(
        kind=kind,
        subject=Subject(node=node, job="j", role="trainer", rank=rank),
        evidence=Evidence(metric=None, detail="test"),
        suggested_tier=tier,
        detected_at=0.0,
        since=100.0,
    )


def engine(per_minute: int | None) -> tuple[PolicyEngine, Reported]:
    det = Reported()
    eng = PolicyEngine(default_policy(), detectors=[det])
    eng.limit_opens_per_node(per_minute)
    return eng, det


def opened(eng: PolicyEngine, now: float) -> list[tuple[FaultKind, Subject]]:
    result = eng.tick(World(now=now, store=SeriesStore()))
    return [(d.kind, d.subject) for d in result.decisions if d.type is DecisionType.OPEN]


def test_a_flood_from_one_node_opens_the_budget_and_one_flood_incident() -> None:
    eng, det = engine(per_minute=8)  # at most 2 per 15 s, 8 per minute
    det.signals = [fault("n1", r) for r in range(100)] + [fault("n2", r) for r in range(2)]
    first = opened(eng, 1000.0)
    n1 = [s for k, s in first if s.node == "n1" and k is not FaultKind.INCIDENT_FLOOD]
    floods = [s for k, s in first if k is FaultKind.INCIDENT_FLOOD]
    assert len(n1) == 2
    assert floods == [Subject(node="n1")]
    assert len([s for _, s in first if s.node == "n2"]) == 2  # another node is not held
    flood = eng.open_incidents["incident_flood:node=n1"]
    assert flood.tier is Tier.MEDIUM
    # Within the quarter minute nothing more opens, and the flood incident stays open.
    assert opened(eng, 1010.0) == []
    assert "incident_flood:node=n1" in eng.open_incidents
    # Then two per quarter minute, never more than eight in any minute.
    times = [1000.0] * 2
    for now in (1015.5, 1031.0, 1046.5, 1050.0, 1060.5, 1076.0):
        got = opened(eng, now)
        assert all(k is FaultKind.STEP_FAILED for k, _ in got)
        times += [now] * len(got)
    for t in times:
        assert sum(1 for u in times if t <= u < t + 60) <= 8, times
    # 2 at 1000, 1015.5, 1031 and 1046.5; none at 1050 (eight in the minute) nor at 1060.5
    # (two in its quarter); 2 at 1076
    assert len(times) == 10


def test_held_faults_open_heaviest_first() -> None:
    eng, det = engine(per_minute=8)
    det.signals = [fault("n1", r) for r in range(10)]
    det.signals.append(fault("n1", 99, Tier.HEAVY, FaultKind.GPU_LOST))
    first = opened(eng, 1000.0)
    kinds = [k for k, _ in first]
    assert FaultKind.GPU_LOST in kinds and kinds.count(FaultKind.STEP_FAILED) == 1


def test_the_flood_incident_resolves_once_nothing_is_held() -> None:
    eng, det = engine(per_minute=12)  # 3 per 15 s
    det.signals = [fault("n1", r) for r in range(4)]
    assert len(opened(eng, 1000.0)) == 4  # three faults and the flood
    det.signals = det.signals[:3]  # the fourth fault went away: nothing held any more
    quiet = default_policy().incidents.quiet_period_seconds
    result = eng.tick(World(now=1001.0 + quiet, store=SeriesStore()))
    resolved = [d.key for d in result.decisions if d.type is DecisionType.RESOLVE]
    assert resolved == ["incident_flood:node=n1"]


def test_no_limit_by_default() -> None:
    eng = PolicyEngine(default_policy(), detectors=[det := Reported()])
    det.signals = [fault("n1", r) for r in range(50)]
    assert len(opened(eng, 1000.0)) == 50
