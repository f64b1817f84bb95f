"""GPU health: critical XIDs, uncorrectable ECC errors, row-remap failure, sustained
throttling, a GPU fallen off the bus."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.ingest.series_store import Point, SeriesKey
from app.policy import metric_names as m
from app.policy.detectors.base import AT_LEAST_ONE, Detector, at_least_one, breach_run, subject_of
from app.policy.detectors.counters import CounterWatch, NodeMemory
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import CHANGED, World


class GpuHealthDetector(Detector):
    """New critical XIDs, uncorrectable ECC increases, row-remap failure, sustained throttling,
    GPU lost from the bus."""

    metrics = (
        m.GPU_XID_CRITICAL_EVENTS_TOTAL,
        m.GPU_ECC_UNCORRECTED_TOTAL,
        m.GPU_REMAPPED_ROWS_FAILURE,
        m.GPU_THROTTLE_THERMAL,
        m.GPU_THROTTLE_POWER,
        m.GPU_LOST,
    )
    lookups = (m.GPU_XID_LAST_CODE,)
    filters = {
        m.GPU_XID_CRITICAL_EVENTS_TOTAL: CHANGED,
        m.GPU_ECC_UNCORRECTED_TOTAL: CHANGED,
        m.GPU_REMAPPED_ROWS_FAILURE: AT_LEAST_ONE,
        m.GPU_THROTTLE_THERMAL: AT_LEAST_ONE,
        m.GPU_THROTTLE_POWER: AT_LEAST_ONE,
        m.GPU_LOST: AT_LEAST_ONE,
    }

    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self._counters = CounterWatch()
        self._nodes = NodeMemory()

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.gpu
        out: list[FaultSignal] = []
        xid_codes: dict[tuple[str, str | None], float] | None = None
        for kind, name in (
            (FaultKind.GPU_XID, m.GPU_XID_CRITICAL_EVENTS_TOTAL),
            (FaultKind.GPU_ECC_UNCORRECTABLE, m.GPU_ECC_UNCORRECTED_TOTAL),
        ):
            for key, ep in self._counters.episodes_of(
                world, name, self._nodes, cfg.event_hold_seconds
            ):
                extra: dict[str, Any] = {"increase": ep.increase, "newest_at": ep.last_ts}
                detail = f"{name} rose by {ep.increase:g}"
                if kind is FaultKind.GPU_XID:
                    if xid_codes is None:
                        xid_codes = {
                            (k.node, k.label(m.LABEL_GPU)): pt.value
                            for k, pt in world.all_series(m.GPU_XID_LAST_CODE)
                        }
                    code = xid_codes.get((key.node, key.label(m.LABEL_GPU)))
                    if code is not None:
                        extra["xid"] = int(code)
                        detail += f" (newest XID {int(code)})"
                evidence = Evidence(
                    metric=name,
                    values=((ep.first_ts, ep.increase),),
                    window_seconds=cfg.event_hold_seconds,
                    threshold=0.0,
                    detail=detail,
                )
                out.append(
                    self.signal(world, kind, subject_of(key), evidence, since=ep.first_ts, **extra)
                )
        for name, kind, detail in (
            (
                m.GPU_REMAPPED_ROWS_FAILURE,
                FaultKind.GPU_ROW_REMAP_FAILURE,
                "row remapping failed: the GPU needs replacing",
            ),
            (m.GPU_LOST, FaultKind.GPU_LOST, "GPU fell off the bus"),
        ):
            for key, point in world.series(name):
                if point.value >= 1 and self.fresh(world, point):
                    out.append(self._flag(world, key, point, kind, detail))
        out.extend(self._throttling(world))
        self._nodes.commit(world)
        return out

    def _flag(
        self, world: World, key: SeriesKey, point: Point, kind: FaultKind, detail: str
    ) -> FaultSignal:
        run = breach_run(world.store.since(key, world.now - 3600), at_least_one)
        since = run[0].ts if run else point.ts
        evidence = Evidence(metric=key.name, values=((since, 1.0),), threshold=1.0, detail=detail)
        return self.signal(world, kind, subject_of(key), evidence, since=since)

    def _throttling(self, world: World) -> Iterable[FaultSignal]:
        sustain = self.policy.detection.gpu.throttle_sustain_seconds
        seen: set[tuple[str, str | None]] = set()
        for name in (m.GPU_THROTTLE_THERMAL, m.GPU_THROTTLE_POWER):
            for key, point in world.series(name):
                ident = (key.node, key.label(m.LABEL_GPU))
                if ident in seen or point.value < 1 or not self.fresh(world, point):
                    continue
                points = world.store.since(
                    key, world.now - sustain - self.policy.detection.stale_sample_seconds
                )
                run = breach_run(points, lambda v: v >= 1)
                if not run or len(run) == len(points) and run[0].ts > world.now - sustain:
                    continue
                start = self.sticky_since(
                    ("throttle", key), run[0].ts, open_ended=len(run) == len(points)
                )
                if world.now - start < sustain:
                    continue
                seen.add(ident)
                evidence = Evidence(
                    metric=name,
                    values=cap_points([(p.ts, p.value) for p in run]),
                    window_seconds=sustain,
                    threshold=1.0,
                    detail=f"{name} for {world.now - start:.0f}s",
                )
                yield self.signal(
                    world, FaultKind.GPU_THROTTLED, subject_of(key), evidence, since=start
                )
