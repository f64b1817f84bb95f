"""A node the scheduler took out of service: ``node_unavailable``.

With ``--slurm-node`` the node agent asks Slurm every 10 s about its node and sends
``slurm_node_unavailable`` 1 while the node is DOWN, DRAIN(ED/ING), FAIL or not responding. Slurm
starts nothing new there (and a DOWN node's jobs are gone): for the jobs on it the node is lost,
whatever its own agent still reports, so the plan is a lost node's (move its batches, rebuild
its shards). The scheduler's word is certain, so there is no observation window: the signal
holds while the newest (fresh) sample says so. A node whose agent went quiet is the silence
detector's case.
"""

from __future__ import annotations

from app.policy.detectors.base import AT_LEAST_ONE, Detector, at_least_one, breach_run
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import World
from recovery.protocol import metric_names as m


class SchedulerNodeDetector(Detector):
    """``slurm_node_unavailable`` at 1 on a node that still reports."""

    metrics = (m.SLURM_NODE_UNAVAILABLE,)
    filters = {m.SLURM_NODE_UNAVAILABLE: AT_LEAST_ONE}

    def detect(self, world: World) -> list[FaultSignal]:
        out: list[FaultSignal] = []
        for key, latest in world.series(m.SLURM_NODE_UNAVAILABLE):
            if latest.value < 1 or not self.fresh(world, latest):
                continue
            run = breach_run(world.store.since(key, world.now - 3600), at_least_one)
            since = run[0].ts if run else latest.ts
            evidence = Evidence(
                metric=m.SLURM_NODE_UNAVAILABLE,
                values=((since, 1.0),),
                threshold=1.0,
                detail=f"Slurm takes node {key.node} out of service (DOWN or DRAIN) since "
                f"{world.now - since:.0f}s ago",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.NODE_UNAVAILABLE,
                    Subject(node=key.node),
                    evidence,
                    since=since,
                    jobs=world.jobs_on_node(key.node),
                )
            )
        return out
