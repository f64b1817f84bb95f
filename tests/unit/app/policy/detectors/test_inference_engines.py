"""rollout_engine_down: an engine that stops answering its health probe gets a restart_role
plan for its role and rank; a silent node and a short miss are not engine faults."""

from __future__ import annotations

from app.policy.plans import ActionName
from app.policy.replay import replay
from app.policy.signals import FaultKind, Tier
from tests.policy_traces import make_traces


def test_engine_down_opens_a_medium_incident_with_a_restart_role_plan() -> None:
    sim, _expect, _ = make_traces.engine_down(1)
    result = replay(make_traces.simulate(sim))
    [opened] = result.opened
    assert opened.kind is FaultKind.ROLLOUT_ENGINE_DOWN and opened.tier is Tier.MEDIUM
    assert (opened.subject.node, opened.subject.role, opened.subject.rank) == ("n2", "rollout", 1)
    assert opened.signal is not None and opened.signal.extra["engine"] == "sglang"
    assert [a.action for a in opened.actions] == [ActionName.RESTART_ROLE]
    assert opened.actions[0].params.get("role") == "rollout"
    assert opened.actions[0].params.get("rank") == 1


def test_engine_on_a_silent_node_is_the_node_detectors_case() -> None:
    sim, _expect, _ = make_traces.engine_down(0)
    # The node goes quiet 5 s after its engine: not fresh enough to judge the engine 30 s on.
    sim.silent_nodes["n1"] = (make_traces.T0 + 55, make_traces.T0 + 10_000)
    sim.duration = 55 + 75 + 10  # long enough for the node to be confirmed silent
    kinds = {d.kind for d in replay(make_traces.simulate(sim)).opened}
    assert FaultKind.ROLLOUT_ENGINE_DOWN not in kinds
    assert FaultKind.NODE_SILENT in kinds
