"""The participants' latest heartbeats as this server process saw them: what the policy tick
reads every second (``IngestService.participants``).

A participant stays in the table after it stops reporting (its silence is what the heartbeat
detector judges), so a node that keeps starting new jobs within its process quota
(``node_quotas.max_participants`` over ``participant_window_seconds``) would grow the table,
and every tick's cost with it, without end. Per node the table keeps the ``keep_per_node`` most
recently reported participants: the ones forgotten first are those of jobs that finished (or
died) longest ago, long after their faults were detected. The durable rows (``participant``)
and the phase history are not touched.
"""

from __future__ import annotations

from app.series.backend import ParticipantHeartbeat
from recovery.protocol.samples import ParticipantReport

ParticipantKey = tuple[str, str, int]  # (job, role, rank)


class ParticipantTable:
    def __init__(self, keep_per_node: int) -> None:
        if keep_per_node < 1:
            raise ValueError(f"keep_per_node must be at least 1, got {keep_per_node}")
        self.keep_per_node = keep_per_node
        self._latest: dict[ParticipantKey, ParticipantHeartbeat] = {}
        # per node, its participants, least recently reported first
        self._by_node: dict[str, dict[ParticipantKey, None]] = {}

    def report(self, node: str, reports: list[ParticipantReport]) -> None:
        """``node`` reported these participants (one batch)."""
        if not reports:
            return
        latest = self._latest
        recent = self._by_node.setdefault(node, {})
        for p in reports:
            pkey = (p.job, p.role, p.rank)
            mem = latest.get(pkey)
            if mem is None or mem.ts <= p.ts:
                latest[pkey] = ParticipantHeartbeat(
                    p.job, p.role, p.rank, node, p.phase, p.step, p.ts
                )
            recent.pop(pkey, None)
            recent[pkey] = None
        while len(recent) > self.keep_per_node:
            pkey = next(iter(recent))
            del recent[pkey]
            mem = latest.get(pkey)
            if mem is not None and mem.node == node:  # not reported by another node since
                del latest[pkey]

    def snapshot(self) -> dict[ParticipantKey, ParticipantHeartbeat]:
        return dict(self._latest)

    def __len__(self) -> int:
        return len(self._latest)
