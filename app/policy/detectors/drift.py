"""Environment drift: nodes of one job whose environment fingerprints differ."""

from __future__ import annotations

from collections import defaultdict

from app.policy.detectors.base import Detector
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import World


class EnvDriftDetector(Detector):
    """Nodes of one job whose environment fingerprints differ."""

    def detect(self, world: World) -> list[FaultSignal]:
        ignore = set(self.policy.detection.env_drift.ignore_keys)
        nodes_by_job: dict[str, set[str]] = defaultdict(set)
        for p in world.participants:
            nodes_by_job[p.job].add(p.node)
        out: list[FaultSignal] = []
        for job, nodes in sorted(nodes_by_job.items()):
            prints = {
                n: {k: v for k, v in world.fingerprints[n].items() if k not in ignore}
                for n in sorted(nodes)
                if n in world.fingerprints
            }
            if len(prints) < 2:
                continue
            keys = sorted({k for fp in prints.values() for k in fp})
            differing = [k for k in keys if len({fp.get(k) for fp in prints.values()}) > 1]
            if not differing:
                continue
            evidence = Evidence(
                metric=None,
                detail="fingerprints differ in "
                + ", ".join(differing)
                + " across "
                + ", ".join(
                    f"{n}({', '.join(f'{k}={fp.get(k)}' for k in differing)})"
                    for n, fp in prints.items()
                ),
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.ENV_DRIFT,
                    Subject(job=job),
                    evidence,
                    since=None,
                    differing_keys=differing,
                    nodes=sorted(prints),
                )
            )
        return out
