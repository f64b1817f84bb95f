"""A node whose clock is off: ``clock_skew``.

The server estimates each node's clock offset from its batches and, while it corrects a node,
keeps the offset as ``agent_clock_offset_seconds`` (``app.ingest.clock_skew``). Detection is
right either way (the stamps are corrected before the detectors read them); this says that the
node's NTP is broken, once the offset has stayed at ``skew_seconds`` or more for
``sustain_seconds``. Light, no plan: a person fixes NTP. The series stops when the offset falls
under the correction threshold, and the stale sample ends the signal.
"""

from __future__ import annotations

from app.ingest.clock_skew import CLOCK_OFFSET_METRIC
from app.policy.detectors.base import Detector, breach_run
from app.policy.signals import Evidence, FaultKind, FaultSignal, Subject
from app.policy.world import World

# How far back the start of a long skew is looked for.
LOOKBACK_SECONDS = 3600


class ClockSkewDetector(Detector):
    """``agent_clock_offset_seconds`` at ``skew_seconds`` or more, sustained."""

    metrics = (CLOCK_OFFSET_METRIC,)

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.clock
        out: list[FaultSignal] = []
        for key, latest in world.series(CLOCK_OFFSET_METRIC):
            if abs(latest.value) < cfg.skew_seconds or not self.fresh(world, latest):
                continue
            run = breach_run(
                world.store.since(key, world.now - LOOKBACK_SECONDS),
                lambda v: abs(v) >= cfg.skew_seconds,
            )
            since = run[0].ts if run else latest.ts
            if world.now - since < cfg.sustain_seconds:
                continue
            way = "behind" if latest.value > 0 else "ahead of"
            evidence = Evidence(
                metric=CLOCK_OFFSET_METRIC,
                values=tuple((p.ts, p.value) for p in run[-10:]) or ((latest.ts, latest.value),),
                window_seconds=cfg.sustain_seconds,
                threshold=cfg.skew_seconds,
                detail=f"node {key.node}'s clock is {abs(latest.value):.1f}s {way} the server's "
                f"(for {world.now - since:.0f}s; its stamps are corrected): check its NTP",
            )
            out.append(
                self.signal(world, FaultKind.CLOCK_SKEW, Subject(node=key.node), evidence,
                            since=since)
            )  # fmt: skip
        return out
