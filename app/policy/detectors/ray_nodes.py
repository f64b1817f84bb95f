"""A Ray node that Ray declared dead: ``node_unavailable`` for the jobs whose actors were on it.

With ``--ray`` the node agent sends ``ray_node_alive{ray_node, job}`` per Ray node (one series
per job with actors there, the ``job`` label absent for a node without any): 0 once Ray's GCS
has declared the node DEAD (its raylet stopped answering the health checks). Ray's word is
certain, like the scheduler's (``app/policy/detectors/scheduler_nodes.py``), so the node is lost at once
and the fault is the same kind, about the Ray node and the job. The job's actors on it are
``RAY_DEAD`` too (``NODE_DIED``), each a ``heartbeat_lost`` of its own.
"""

from __future__ import annotations

from app.policy.detectors.base import Detector, breach_run
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import Threshold, World
from recovery.protocol import metric_names as m

_DEAD = Threshold("le", 0.0)


class RayNodeDeadDetector(Detector):
    """``ray_node_alive`` at 0 in a fresh sample from an agent that reports."""

    metrics = (m.RAY_NODE_ALIVE,)
    filters = {m.RAY_NODE_ALIVE: _DEAD}

    def detect(self, world: World) -> list[FaultSignal]:
        out: list[FaultSignal] = []
        for key, latest in world.series(m.RAY_NODE_ALIVE):
            ray_node = key.label(m.LABEL_RAY_NODE)
            if latest.value > 0 or ray_node is None or not self.fresh(world, latest):
                continue
            run = breach_run(world.store.since(key, world.now - 3600), _DEAD)
            since = run[0].ts if run else latest.ts
            job = key.label(m.LABEL_JOB)
            evidence = Evidence(
                metric=m.RAY_NODE_ALIVE,
                values=((since, 0.0),),
                threshold=0.0,
                detail=f"Ray declared node {ray_node} dead {world.now - since:.0f}s ago "
                f"(reported by the agent on {key.node})",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODE_UNAVAILABLE,
                    Subject(node=ray_node, job=job),
                    evidence,
                    since=since,
                )
            )
        return out
