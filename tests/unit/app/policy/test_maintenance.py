"""Maintenance windows in the policy engine: the silence kinds are not raised for a node or job
under an open window (``World.maintenance``); everything else is judged as usual."""

from __future__ import annotations

from app.policy.engine import DecisionType, PolicyEngine
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject, Tier
from app.policy.world import Maintenance
from tests.unit.app.policy._helpers import JOB, Cluster


def sig(kind: FaultKind, subject: Subject, **extra: object) -> FaultSignal:
    return FaultSignal(kind, subject, Evidence(metric=None), Tier.MEDIUM, 0.0, extra=dict(extra))


def test_a_node_window_covers_the_silence_kinds_on_that_node_only() -> None:
    m = Maintenance(windows=frozenset({("n1", None)}))
    assert m.covers(sig(FaultKind.NODE_SILENT, Subject(node="n1")))
    assert m.covers(sig(FaultKind.NODE_UNAVAILABLE, Subject(node="n1")))
    assert m.covers(sig(FaultKind.HEARTBEAT_LOST, Subject(node="n1", job=JOB, role="rollout")))
    assert not m.covers(sig(FaultKind.NODE_SILENT, Subject(node="n2")))
    # Not a silence: a GPU fault on the node is still a fault (the muting holds its actions).
    assert not m.covers(sig(FaultKind.GPU_XID, Subject(node="n1", gpu="0")))


def test_a_loss_of_several_nodes_is_covered_only_if_every_node_is() -> None:
    m = Maintenance(windows=frozenset({("n1", None), ("n2", None)}))
    assert m.covers(sig(FaultKind.NODES_LOST, Subject(job=JOB), nodes=["n1", "n2"]))
    assert not m.covers(sig(FaultKind.NODES_LOST, Subject(job=JOB), nodes=["n1", "n2", "n3"]))


def test_job_windows_cover_the_job_everywhere_and_a_job_on_a_node_only_there() -> None:
    whole = Maintenance(windows=frozenset({(None, JOB)}))
    assert whole.covers(sig(FaultKind.HEARTBEAT_LOST, Subject(node="n7", job=JOB, role="t")))
    assert not whole.covers(sig(FaultKind.HEARTBEAT_LOST, Subject(node="n7", job="other")))
    assert not whole.covers(sig(FaultKind.NODE_SILENT, Subject(node="n7")))
    there = Maintenance(windows=frozenset({("n1", JOB)}))
    assert there.covers(sig(FaultKind.HEARTBEAT_LOST, Subject(node="n1", job=JOB, role="t")))
    assert not there.covers(sig(FaultKind.HEARTBEAT_LOST, Subject(node="n2", job=JOB, role="t")))
    assert not there.covers(sig(FaultKind.NODE_SILENT, Subject(node="n1")))  # other jobs there
    assert not Maintenance().covers(sig(FaultKind.NODE_SILENT, Subject(node="n1")))


def test_the_engine_opens_nothing_for_a_silent_node_under_a_window_and_opens_it_after() -> None:
    c = Cluster()
    engine = PolicyEngine(c.policy)

    def both_report(cl: Cluster) -> None:
        for node in ("n1", "n2"):
            cl.put(node, "gpu_utilization_ratio", 0.8, gpu="0")

    c.run(5, both_report, engine)
    c.maintenance = Maintenance(windows=frozenset({("n1", None)}))
    opened = c.run(120, lambda cl: None, engine)  # both nodes silent for two minutes
    # Two nodes silent together would be a heavy nodes_lost; n1 is silent on purpose.
    assert [(d.kind, d.subject.node) for d in opened if d.type is DecisionType.OPEN] == [
        (FaultKind.NODE_SILENT, "n2")
    ]
    # The window closes with n1 still silent: now two nodes are silent together.
    c.maintenance = Maintenance()
    after = [d for d in c.run(2, lambda cl: None, engine) if d.type is DecisionType.OPEN]
    assert [d.kind for d in after] == [FaultKind.NODES_LOST]
    assert after[0].signal is not None and after[0].signal.extra["nodes"] == ["n1", "n2"]
