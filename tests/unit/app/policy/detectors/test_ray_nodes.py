"""node_unavailable for a Ray node that Ray declared dead (``ray_node_alive`` 0, agent --ray)."""

from __future__ import annotations

from app.policy.detectors.ray_nodes import RayNodeDeadDetector
from app.policy.signals import FaultKind
from recovery.protocol import metric_names as m

from .._helpers import JOB, Cluster


def test_a_dead_ray_node_is_lost_at_once_for_the_job_on_it_and_clears_when_back() -> None:
    c = Cluster()
    det = RayNodeDeadDetector(c.policy)

    def alive(value: float):
        def feed(c: Cluster) -> None:
            c.put("head", m.RAY_NODE_ALIVE, 1, ray_node="10.0.0.1", job=JOB)
            c.put("head", m.RAY_NODE_ALIVE, value, ray_node="10.0.0.2", job=JOB)
            c.put("head", m.RAY_NODE_ALIVE, value, ray_node="10.0.0.3")  # no actors there

        return feed

    assert c.run(3, alive(1), detector=det) == [[], [], []]
    dead_at = c.now + 1
    res = c.run(2, alive(0), detector=det)
    subjects = sorted((s.subject.node, s.subject.job) for s in res[0])
    assert subjects == [("10.0.0.2", JOB), ("10.0.0.3", None)]
    sig = [s for s in res[0] if s.subject.node == "10.0.0.2"][0]
    assert sig.kind is FaultKind.NODE_UNAVAILABLE and sig.since == dead_at
    assert "Ray declared node 10.0.0.2 dead" in sig.evidence.detail
    assert [s.since for s in res[1] if s.subject.node == "10.0.0.2"] == [dead_at]  # one occurrence
    assert c.run(1, alive(1), detector=det) == [[]]


def test_an_old_sample_is_not_judged() -> None:
    c = Cluster()
    det = RayNodeDeadDetector(c.policy)
    c.put("head", m.RAY_NODE_ALIVE, 0, ray_node="10.0.0.2", job=JOB)
    c.now += c.policy.detection.stale_sample_seconds + 5
    assert c.run(1, lambda c: c.put("head", "x", 1), detector=det) == [[]]
