"""GPU health: XIDs (judged by NVIDIA's resolution bucket for each code, app/policy/xid_catalog.py),
uncorrectable ECC errors, row-remap failure, sustained throttling, a GPU fallen off the bus."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from app.policy.detectors.base import AT_LEAST_ONE, Detector, at_least_one, breach_run, subject_of
from app.policy.detectors.counters import CounterWatch, Episode, NodeMemory
from app.policy.policy_file import Policy
from app.policy.signals import Evidence, FaultKind, FaultSignal, cap_points
from app.policy.world import CHANGED, World
from app.policy.xid_catalog import bucket_of, entry_of
from app.series.store import Point, SeriesKey
from recovery.protocol import metric_names as m


def xid_text(code: int) -> str:
    """An XID as the evidence shows it: its code, NVIDIA's mnemonic and resolution bucket."""
    entry = entry_of(code)
    return f"XID {code} ({entry.mnemonic}; NVIDIA: {entry.bucket.value})"


class GpuHealthDetector(Detector):
    """New XIDs, uncorrectable ECC increases, row-remap failure, sustained throttling,
    GPU lost from the bus."""

    metrics = (
        m.GPU_XID_EVENTS_TOTAL,
        m.GPU_XID_CRITICAL_EVENTS_TOTAL,
        m.GPU_ECC_UNCORRECTED_TOTAL,
        m.GPU_REMAPPED_ROWS_FAILURE,
        m.GPU_THROTTLE_THERMAL,
        m.GPU_THROTTLE_POWER,
        m.GPU_LOST,
    )
    lookups = (m.GPU_XID_LAST_CODE,)
    filters = {
        m.GPU_XID_EVENTS_TOTAL: CHANGED,
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
        # GPUs whose agent sends per-code XID counters: judged by code, not by the critical one
        self._per_code_gpus: set[tuple[str, str | None]] = set()

    def detect(self, world: World) -> list[FaultSignal]:
        cfg = self.policy.detection.gpu
        out = self._xids_by_code(world)
        out.extend(self._xids_by_critical_counter(world))
        for key, ep in self._counters.episodes_of(
            world, m.GPU_ECC_UNCORRECTED_TOTAL, self._nodes, cfg.event_hold_seconds
        ):
            evidence = Evidence(
                metric=m.GPU_ECC_UNCORRECTED_TOTAL,
                values=((ep.first_ts, ep.increase),),
                window_seconds=cfg.event_hold_seconds,
                threshold=0.0,
                detail=f"{m.GPU_ECC_UNCORRECTED_TOTAL} rose by {ep.increase:g}",
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.GPU_ECC_UNCORRECTABLE,
                    subject_of(key),
                    evidence,
                    since=ep.first_ts,
                    increase=ep.increase,
                    newest_at=ep.last_ts,
                )
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

    def _xids_by_code(self, world: World) -> list[FaultSignal]:
        """One gpu_xid per GPU from the per-code counters (every XID the agent saw, by code),
        judged by the catalog bucket of its codes; codes of ignored buckets open nothing."""
        cfg = self.policy.detection.gpu
        for key, _ in world.series(m.GPU_XID_EVENTS_TOTAL):
            self._per_code_gpus.add((key.node, key.label(m.LABEL_GPU)))
        by_gpu: dict[tuple[str, str | None], list[tuple[int, SeriesKey, Episode]]] = {}
        for key, ep in self._counters.episodes_of(
            world, m.GPU_XID_EVENTS_TOTAL, self._nodes, cfg.event_hold_seconds
        ):
            raw = key.label(m.LABEL_XID)
            if raw is None or not raw.isdigit():
                continue
            code = int(raw)
            if bucket_of(code) in cfg.ignore_xid_buckets:
                continue
            by_gpu.setdefault((key.node, key.label(m.LABEL_GPU)), []).append((code, key, ep))
        out = []
        for events in by_gpu.values():
            # The incident is named for its most severe code (the newest among equals).
            lead, key, _ = max(events, key=lambda e: (self._severity(e[0]), e[2].last_ts))
            first = min(ep.first_ts for _, _, ep in events)
            newest = max(ep.last_ts for _, _, ep in events)
            increase = sum(ep.increase for _, _, ep in events)
            codes = sorted({code for code, _, _ in events})
            evidence = Evidence(
                metric=m.GPU_XID_EVENTS_TOTAL,
                values=tuple(sorted((ep.first_ts, float(code)) for code, _, ep in events)),
                window_seconds=cfg.event_hold_seconds,
                threshold=0.0,
                detail="; ".join(xid_text(c) for c in [lead, *(c for c in codes if c != lead)]),
            )
            out.append(
                self.signal(
                    world,
                    FaultKind.GPU_XID,
                    subject_of(key),
                    evidence,
                    since=first,
                    xid=lead,
                    xid_bucket=bucket_of(lead).value,
                    xids=codes,
                    increase=increase,
                    newest_at=newest,
                )
            )
        return out

    def _severity(self, code: int) -> int:
        return self.policy.xid_buckets[bucket_of(code)].tier.rank

    def _xids_by_critical_counter(self, world: World) -> list[FaultSignal]:
        """XIDs of a GPU that sends no per-code counter (an older agent): the critical-XID
        counter, with the newest code from ``gpu_xid_last_code`` when there is one."""
        cfg = self.policy.detection.gpu
        out = []
        xid_codes: dict[tuple[str, str | None], float] | None = None
        for key, ep in self._counters.episodes_of(
            world, m.GPU_XID_CRITICAL_EVENTS_TOTAL, self._nodes, cfg.event_hold_seconds
        ):
            ident = (key.node, key.label(m.LABEL_GPU))
            if ident in self._per_code_gpus:
                continue  # judged by code in _xids_by_code
            extra: dict[str, Any] = {"increase": ep.increase, "newest_at": ep.last_ts}
            detail = f"{m.GPU_XID_CRITICAL_EVENTS_TOTAL} rose by {ep.increase:g}"
            if xid_codes is None:
                xid_codes = {
                    (k.node, k.label(m.LABEL_GPU)): pt.value
                    for k, pt in world.all_series(m.GPU_XID_LAST_CODE)
                }
            code = xid_codes.get(ident)
            if code is not None:
                if bucket_of(int(code)) in cfg.ignore_xid_buckets:
                    continue
                extra.update(xid=int(code), xid_bucket=bucket_of(int(code)).value)
                detail += f" (newest {xid_text(int(code))})"
            evidence = Evidence(
                metric=m.GPU_XID_CRITICAL_EVENTS_TOTAL,
                values=((ep.first_ts, ep.increase),),
                window_seconds=cfg.event_hold_seconds,
                threshold=0.0,
                detail=detail,
            )
            out.append(
                self.signal(
                    world, FaultKind.GPU_XID, subject_of(key), evidence, since=ep.first_ts, **extra
                )
            )
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
