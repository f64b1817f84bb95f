"""Agent clocks that are off: each node's offset, estimated from its batches, and its stamps
moved onto the server's clock.

The agent stamps a batch's ``sent_at`` when it sends it, and the server takes its receive time
when the request arrives, before parsing: ``received - sent_at`` is the node clock's offset plus
a network delay that is never negative, so the smallest of the node's last ``KEPT`` differences
is the estimate. A node whose offset is at least ``correct_above_seconds`` has every sample and
heartbeat stamp of its batches moved by it before anything reads them, from its first batch (a
node 30 s behind would otherwise look 30 s stale); below that nothing is touched. The offset is
*recorded* as the node's skew only once it is certain: a node ahead at once, a node behind once
``AGREE`` batches say so. A recorded offset is kept as the series
``agent_clock_offset_seconds``, which the ``clock_skew`` detector reads.

The live server (``app.ingest.pipeline``) and ``rlguard replay`` (``app.policy.replay``, with a
trace's ``received_at``) correct the same way, so the corpus replays what the server sees.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from app.ingest.validation import ValidBatch
from app.series.store import SeriesKey
from recovery.protocol.samples import ParticipantReport

# Measured by the server, never sent by an agent (the policy's metric_names re-exports it).
CLOCK_OFFSET_METRIC = "agent_clock_offset_seconds"
# How many of a node's recent batches the estimate looks at (about a minute of batches).
KEPT = 16
# How many batches must agree before a node's lag is recorded as its clock being behind.
AGREE = 3


@dataclass(slots=True)
class ClockOffsets:
    """Per node: the recent ``received - sent_at`` differences and the estimate they give."""

    correct_above_seconds: float = 5.0
    _recent: dict[str, deque[float]] = field(default_factory=dict)

    def observe(self, node: str, sent_at: float, received_at: float) -> float:
        """Record one batch of ``node``; its offset estimate now (server minus node clock)."""
        recent = self._recent.get(node)
        if recent is None:
            recent = self._recent[node] = deque(maxlen=KEPT)
        recent.append(received_at - sent_at)
        return min(recent)

    def correct(self, batch: ValidBatch, received_at: float) -> tuple[ValidBatch, float | None]:
        """``batch`` on the server's clock, and the node's offset to record (None: none
        needed, or not certain yet: see the module docstring)."""
        offset = self.observe(batch.node, batch.sent_at, received_at)
        if abs(offset) < self.correct_above_seconds:
            return batch, None
        certain = offset < 0 or len(self._recent[batch.node]) >= AGREE
        return shifted(batch, offset), offset if certain else None


def shifted(batch: ValidBatch, offset: float) -> ValidBatch:
    """Every stamp of ``batch`` moved by ``offset`` seconds."""
    return replace(
        batch,
        sent_at=batch.sent_at + offset,
        samples=[(key, ts + offset, value) for key, ts, value in batch.samples],
        participants=[
            ParticipantReport(p.job, p.role, p.rank, p.phase, p.step, p.ts + offset)
            for p in batch.participants
        ],
    )


def offset_sample(node: str, offset: float, received_at: float) -> tuple[SeriesKey, float, float]:
    """The node's offset as a sample of ``agent_clock_offset_seconds``."""
    return (SeriesKey.of(node, CLOCK_OFFSET_METRIC, {}), received_at, offset)
