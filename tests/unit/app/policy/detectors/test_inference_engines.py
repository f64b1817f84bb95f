"""rollout_engine_down: an engine that stops answering its health probe gets a restart_role
plan for its role and rank; a silent node and a short miss are not engine faults. An engine dead
inside a live worker (no tokens while work piles up) is the same fault, seen from progress; a
rollout waiting on a tool is not."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.policy.detectors import EngineStalledDetector
from app.policy.engine import PolicyEngine
from app.policy.plans import ActionName
from app.policy.replay import replay
from app.policy.signals import FaultKind, Tier
from recovery.protocol import metric_names as m
from tests.policy_traces import make_traces

from .._helpers import JOB, Cluster, first_firing


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


# -- an engine dead inside a live worker (EngineStalledDetector) ------------------------------

STALL = 60  # detection.rollout.stall_timeout_seconds in policy.yaml


def _rollout(
    tokens: float,
    pending: float | None,
    *,
    step: int = 7,
    phase: str = "ROLLOUT",
    heartbeat_age: float = 0.5,
) -> Callable[[Cluster], None]:
    """Every second, rollout-0 on n1 as the agent reports it: tokens/s, pending rollouts."""

    def f(c: Cluster) -> None:
        c.put("n1", m.ROLLOUT_TOKENS_PER_SECOND, tokens, job=JOB, role="rollout", rank="0")
        if pending is not None:
            c.put("n1", m.ROLLOUT_PENDING_COUNT, pending, job=JOB, role="rollout", rank="0")
        c.participant("rollout", 0, "n1", phase=phase, step=step, heartbeat=c.now - heartbeat_age)

    return f


def _piling(start: float = 2.0, rate: float = 0.25, **kw: Any) -> Callable[[Cluster], None]:
    """Zero tokens while the pending count rises by ``rate`` a second."""
    pending = [start]

    def f(c: Cluster) -> None:
        pending[0] += rate
        _rollout(0.0, pending[0], **kw)(c)

    return f


def test_no_tokens_while_pending_work_rises_is_an_engine_dead_inside_a_live_worker() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    c.run(20, _rollout(900.0, 1.0), detector=det)
    res = c.run(STALL + 5, _piling(), detector=det)
    fired = first_firing(res)
    assert fired is not None and STALL <= fired <= STALL + 2, fired
    sig = res[-1][0]
    assert sig.kind is FaultKind.ROLLOUT_ENGINE_DOWN and sig.extra["reason"] == "no_progress"
    assert (sig.subject.node, sig.subject.role, sig.subject.rank) == ("n1", "rollout", 0)
    assert "pending rollouts rose" in sig.evidence.detail
    assert "heartbeat is alive" in sig.evidence.detail


def test_no_tokens_with_work_pending_and_the_step_frozen_fires_too() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    res = c.run(STALL + 5, _rollout(0.0, 6.0, step=7), detector=det)
    fired = first_firing(res)
    assert fired is not None and STALL <= fired <= STALL + 2, fired
    assert "step stayed at 7" in res[-1][0].evidence.detail


def test_a_rollout_waiting_on_a_tool_with_nothing_piling_up_stays_quiet() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    res = c.run(20, _rollout(900.0, 0.0), detector=det)
    res += c.run(3 * STALL, _rollout(0.0, 0.0), detector=det)  # nothing waits at its engine
    res += c.run(3 * STALL, _rollout(0.0, None), detector=det)  # it reports no pending count
    assert first_firing(res) is None


def test_work_pending_while_the_step_moves_is_no_dead_engine() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    step = [7.0]

    def moving(cl: Cluster) -> None:
        step[0] += 0.1
        _rollout(0.0, 6.0, step=int(step[0]))(cl)

    assert first_firing(c.run(3 * STALL, moving, detector=det)) is None


def test_a_stall_shorter_than_the_timeout_is_not_judged() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    res = c.run(STALL - 10, _piling(), detector=det)
    res += c.run(5, _rollout(900.0, 4.0), detector=det)
    res += c.run(STALL - 10, _piling(start=4.0), detector=det)
    assert first_firing(res) is None


def test_a_silent_worker_and_a_starting_one_are_not_this_detectors_case() -> None:
    c = Cluster()
    det = EngineStalledDetector(c.policy)
    # Heartbeat late: the rollout stall detector's rollout_down, not an engine inside a live one.
    res = c.run(2 * STALL, _piling(heartbeat_age=20.0), detector=det)
    assert first_firing(res) is None
    c2 = Cluster()
    det2 = EngineStalledDetector(c2.policy)
    # Loading and compiling, its queue filling: within its start-up grace.
    res = c2.run(5, _rollout(0.0, 1.0, phase="STARTING"), detector=det2)
    res += c2.run(2 * STALL, _piling(), detector=det2)
    assert first_firing(res) is None


def test_the_progress_case_is_one_incident_with_the_probe_plan() -> None:
    c = Cluster()
    engine = PolicyEngine(c.policy)
    c.run(10, _rollout(900.0, 1.0), engine=engine)
    decisions = c.run(STALL + 5, _piling(), engine=engine)
    [opened] = decisions
    assert opened.kind is FaultKind.ROLLOUT_ENGINE_DOWN and opened.tier is Tier.MEDIUM
    assert [a.action for a in opened.actions] == [ActionName.RESTART_ROLE]
