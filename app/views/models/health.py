"""How the dashboard colours a GPU, a node and a participant.

Levels are ``ok`` (green), ``warn`` (amber), ``bad`` (red) and ``idle`` (grey: no data). The
colour is a summary for the eye; the policy engine, not this module, decides what is a fault.
Liveness bounds come from the policy settings (the same 15 s / 60 s the detectors use).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from app.policy.signals import Tier

# NVML metric names, as the agent sends them (docs/metrics.md).
GPU_UTIL = "gpu_utilization_ratio"
GPU_TEMP = "gpu_temperature_celsius"
GPU_MEM_USED = "gpu_memory_used_bytes"
GPU_MEM_TOTAL = "gpu_memory_total_bytes"
GPU_POWER = "gpu_power_watts"
GPU_LOST = "gpu_lost"
GPU_THROTTLE_THERMAL = "gpu_throttle_thermal_active"
GPU_THROTTLE_POWER = "gpu_throttle_power_active"
GPU_REMAP_FAILURE = "gpu_remapped_rows_failure"
GPU_ECC_UNCORRECTED = "gpu_ecc_uncorrected_errors_total"
GPU_ECC_CORRECTED = "gpu_ecc_corrected_errors_total"
GPU_XID_CRITICAL = "gpu_xid_critical_events_total"
GPU_XID_LAST = "gpu_xid_last_code"

GPU_METRICS = frozenset(
    {
        GPU_UTIL,
        GPU_TEMP,
        GPU_MEM_USED,
        GPU_MEM_TOTAL,
        GPU_POWER,
        GPU_LOST,
        GPU_THROTTLE_THERMAL,
        GPU_THROTTLE_POWER,
        GPU_REMAP_FAILURE,
        GPU_ECC_UNCORRECTED,
        GPU_XID_CRITICAL,
        GPU_XID_LAST,
    }
)

# Data-centre GPUs start slowing themselves down around 85-90 °C; amber a little before that so
# the operator sees the trend, red where the hardware is already protecting itself.
GPU_TEMP_WARN_C = 83.0
GPU_TEMP_BAD_C = 90.0

LEVEL_RANK = {"idle": 0, "ok": 1, "warn": 2, "bad": 3}
# keyed by the tier value as incidents store it (Tier is a StrEnum: its members are those strings)
TIER_LEVEL: dict[str, str] = {Tier.LIGHT: "warn", Tier.MEDIUM: "bad", Tier.HEAVY: "bad"}


def worst(levels: Iterable[str]) -> str:
    result = "idle"
    for level in levels:
        if LEVEL_RANK[level] > LEVEL_RANK[result]:
            result = level
    return result


@dataclass(slots=True)
class GpuNow:
    """Latest values of one GPU (``None`` where the agent sent nothing)."""

    index: str
    util: float | None = None  # 0..1
    temp: float | None = None
    mem_used: float | None = None
    mem_total: float | None = None
    power: float | None = None
    lost: bool = False
    # Tuples, empty by default: a judgement of 1,000 nodes keeps 8,000 GpuNow for seconds, and
    # two empty lists each tripled the objects the cyclic GC then walks (and its full passes
    # over the series store are what stalled the cold heat map).
    throttled: Sequence[str] = ()
    remap_failure: bool = False
    ecc_uncorrected: float | None = None
    xid_critical: float | None = None
    xid_last: float | None = None

    @property
    def mem_ratio(self) -> float | None:
        if self.mem_used is None or not self.mem_total:
            return None
        return self.mem_used / self.mem_total

    # Set by ``judge()`` once every value is in (gpus_from_latest, overview.live_gpus).
    level: str = "idle"
    reasons: Sequence[str] = ()

    def judge(self) -> None:
        level, reasons = gpu_level(self)
        self.level, self.reasons = level, tuple(reasons)

    @property
    def title(self) -> str:
        """The grid's tooltip. Made when a template asks, not in ``judge``: the fleet view
        judges every GPU of 1,000 nodes per render but draws the cells of one page of them."""
        util = "–" if self.util is None else f"{self.util * 100:.0f}%"
        temp = "–" if self.temp is None else f"{self.temp:.0f} °C"
        title = f"GPU {self.index}: {util} util, {temp}"
        return f"{title} — {', '.join(self.reasons)}" if self.reasons else title

    @classmethod
    def of(cls, index: str, values: Mapping[str, float]) -> GpuNow:
        """GPU ``index`` from its latest value per metric name, judged. One constructor call per
        GPU: the fleet view builds 8,000 of these per judgement of 1,000 nodes."""
        get = values.get
        thermal, power = get(GPU_THROTTLE_THERMAL, 0.0) >= 1, get(GPU_THROTTLE_POWER, 0.0) >= 1
        gpu = cls(
            index,
            util=get(GPU_UTIL),
            temp=get(GPU_TEMP),
            mem_used=get(GPU_MEM_USED),
            mem_total=get(GPU_MEM_TOTAL),
            power=get(GPU_POWER),
            lost=get(GPU_LOST, 0.0) >= 1,
            throttled=_THROTTLED[thermal, power],
            remap_failure=get(GPU_REMAP_FAILURE, 0.0) >= 1,
            ecc_uncorrected=get(GPU_ECC_UNCORRECTED),
            xid_critical=get(GPU_XID_CRITICAL),
            xid_last=get(GPU_XID_LAST),
        )
        gpu.judge()
        return gpu


# (thermal, power) -> GpuNow.throttled: shared tuples, always in this order.
_THROTTLED = {
    (False, False): (),
    (True, False): ("thermal",),
    (False, True): ("power",),
    (True, True): ("thermal", "power"),
}


def gpu_level(gpu: GpuNow) -> tuple[str, list[str]]:
    if gpu.lost:
        return "bad", ["GPU lost from the bus"]
    if gpu.util is None and gpu.temp is None and gpu.mem_used is None:
        return "idle", ["no samples"]
    reasons: list[str] = []
    level = "ok"
    if gpu.remap_failure:
        level = "bad"
        reasons.append("row remapping failed")
    temp = gpu.temp
    if temp is not None and temp >= GPU_TEMP_WARN_C:
        if temp >= GPU_TEMP_BAD_C:
            level = "bad"
        elif level == "ok":
            level = "warn"
        reasons.append(f"{temp:.0f} °C")
    if gpu.throttled:
        if level == "ok":
            level = "warn"
        reasons.append("throttled: " + ", ".join(gpu.throttled))
    return level, reasons


def liveness_level(age_seconds: float | None, *, suspect_after: float, confirm_after: float) -> str:
    """ok while heartbeats are fresh, warn once suspected, bad once confirmed, idle if never seen."""
    if age_seconds is None:
        return "idle"
    if age_seconds >= confirm_after:
        return "bad"
    if age_seconds >= suspect_after:
        return "warn"
    return "ok"


def liveness_mark(age_seconds: float | None, *, suspect_after: float, confirm_after: float) -> str:
    level = liveness_level(age_seconds, suspect_after=suspect_after, confirm_after=confirm_after)
    return {"ok": "alive", "warn": "suspected", "bad": "confirmed lost", "idle": "never seen"}[
        level
    ]


def gpus_from_latest(latest: Mapping[str, Mapping[str, float]]) -> list[GpuNow]:
    """``{gpu index: {metric: value}}`` → GPUs sorted by numeric index."""
    gpus = [GpuNow.of(index, metrics) for index, metrics in latest.items()]
    gpus.sort(key=gpu_sort_key)
    return gpus


def gpu_sort_key(gpu: GpuNow) -> tuple[bool, int, str]:
    """GPU 2 before GPU 10; odd names after the numbered ones."""
    digits = gpu.index.isdigit()
    return (not digits, int(gpu.index) if digits else 0, gpu.index)
