"""GPU health from NVML (nvidia-ml-py), one round of samples per call to :meth:`collect`.

``nvml`` is the ``pynvml`` module itself or anything with the same functions (the simulated
``agents.fake_nvml.FakeNVML``). Errors are the real ``pynvml`` exception classes:

- ``NVMLError_NotSupported`` (and ``NoPermission`` / ``FunctionNotFound``): the GPU lacks the
  field; it is skipped for that GPU from then on and logged once.
- ``NVMLError_GpuIsLost``: the GPU fell off the bus; ``gpu_lost 1`` is reported, the other fields
  are skipped, and the GPU is probed again every round.
- No NVML at all (no library, no driver): reported once, ``agent_nvml_available 0``; the agent
  keeps sending job signals and retries the initialisation every ``init_retry_s`` seconds.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from agents.collectors.gpu_source import GpuSource, XidTally, throttle_flags
from recovery.protocol.samples import Sample, make_sample

log = logging.getLogger("rlguard.agent.nvml")

# Errors that will not go away by asking again: treat the field as absent on this GPU.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_FunctionNotFound,
)
_MAX_EVENTS_PER_ROUND = 64
# (metric, counter key, NVML counter): CRC errors sum the flit and data CRC counters.
_NVLINK_COUNTERS = (
    ("gpu_nvlink_crc_errors_total", "crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("gpu_nvlink_crc_errors_total", "crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("gpu_nvlink_replay_errors_total", "replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("gpu_nvlink_recovery_errors_total", "recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)


class _GpuLost(Exception):
    """Internal: a call for this GPU raised NVMLError_GpuIsLost; stop reading it this round."""


@dataclass
class _GpuState:
    index: int
    handle: Any = None
    uuid: str = "unknown"
    model: str = "unknown"
    unsupported: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)  # fields whose last read failed (logged once)
    lost: bool = False
    event_set: Any = None
    xids: XidTally = field(default_factory=XidTally)
    last_xid: int | None = None
    nvlink_links: list[int] | None = None
    nvlink_cache: dict[str, float] = field(default_factory=dict)


class NvmlCollector(GpuSource):
    """Samples every GPU that NVML reports; see the module docstring for the error policy.

    ``simulated`` adds ``simulated="1"`` to every sample. ``nvlink_every`` reads the NVLink error
    counters every that many rounds (they are many calls per GPU and change rarely); the last
    values are repeated in between.
    """

    def __init__(
        self,
        nvml: Any,
        *,
        simulated: bool = False,
        clock: Callable[[], float] = time.time,
        init_retry_s: float = 60.0,
        nvlink_every: int = 10,
    ) -> None:
        self._nvml = nvml
        self._simulated = simulated
        self._clock = clock
        self._init_retry_s = init_retry_s
        self._nvlink_every = max(1, nvlink_every)
        self._gpus: list[_GpuState] = []
        self._available = False
        self._last_init_attempt = float("-inf")
        self._unavailable_reason: str | None = None
        self._round = 0

    def start(self) -> bool:
        """Initialise NVML and enumerate the GPUs; False (logged once) when NVML is missing."""
        self._last_init_attempt = self._clock()
        try:
            self._nvml.nvmlInit()
            count = int(self._nvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self._unavailable_reason is None:
                log.warning(
                    "NVML is not available (%s); sending no GPU metrics, job signals continue",
                    reason,
                )
            self._unavailable_reason = reason
            return False
        self._available = True
        if self._unavailable_reason is not None:
            log.warning("NVML is available again after: %s", self._unavailable_reason)
        self._unavailable_reason = None
        self._gpus = [self._open_gpu(i) for i in range(count)]
        log.info("NVML initialised: %d GPU(s)%s", count, " (simulated)" if self._simulated else "")
        return True

    def close(self) -> None:
        """Free the event sets and shut NVML down (errors are logged, not raised)."""
        if not self._available:
            return
        for gpu in self._gpus:
            if gpu.event_set is not None:
                try:
                    self._nvml.nvmlEventSetFree(gpu.event_set)
                except pynvml.NVMLError as exc:
                    log.debug("gpu %d: freeing the event set failed: %s", gpu.index, exc)
                gpu.event_set = None
        try:
            self._nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)
        self._available = False

    def driver_versions(self) -> dict[str, str]:
        """Driver and CUDA driver version as NVML reports them (empty when NVML is missing)."""
        if not self._available:
            return {}
        out: dict[str, str] = {}
        try:
            driver = self._nvml.nvmlSystemGetDriverVersion()
            out["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        except pynvml.NVMLError as exc:
            log.debug("driver version unavailable: %s", exc)
        try:
            cuda = int(self._nvml.nvmlSystemGetCudaDriverVersion())
            out["cuda_driver"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except pynvml.NVMLError as exc:
            log.debug("CUDA driver version unavailable: %s", exc)
        return out

    def collect(self) -> list[Sample]:
        """Read every GPU once and return the samples of this round."""
        if not self._available:
            if self._clock() - self._last_init_attempt >= self._init_retry_s:
                self.start()
            if not self._available:
                return []
        self._round += 1
        out: list[Sample] = []
        for gpu in self._gpus:
            self._collect_gpu(gpu, out)
        return out

    # -- one GPU ---------------------------------------------------------------------------

    def _labels(self, gpu: _GpuState, **extra: str) -> dict[str, str]:
        labels = {"gpu": str(gpu.index), **extra}
        if self._simulated:
            labels["simulated"] = "1"
        return labels

    def _open_gpu(self, index: int) -> _GpuState:
        gpu = _GpuState(index=index)
        self._init_handle(gpu)
        return gpu

    def _init_handle(self, gpu: _GpuState) -> bool:
        """Get the handle, identity and XID registration of ``gpu``; False if it is lost."""
        try:
            handle = self._nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except pynvml.NVMLError as exc:
            if not gpu.lost:
                log.error(
                    "gpu %d: no handle (%s: %s); reported as lost",
                    gpu.index,
                    type(exc).__name__,
                    exc,
                )
            gpu.lost = True
            return False
        gpu.handle = handle
        try:
            gpu.uuid = str(
                self._read(gpu, "uuid", self._nvml.nvmlDeviceGetUUID, handle) or "unknown"
            )
            gpu.model = str(
                self._read(gpu, "name", self._nvml.nvmlDeviceGetName, handle) or "unknown"
            )
            self._register_xid_events(gpu)
        except _GpuLost:
            if not gpu.lost:
                log.error("gpu %d is lost (fallen off the bus)", gpu.index)
            gpu.lost = True
            return False
        return True

    def _register_xid_events(self, gpu: _GpuState) -> None:
        supported = self._read(
            gpu, "xid_events", self._nvml.nvmlDeviceGetSupportedEventTypes, gpu.handle
        )
        if supported is None:
            return
        if not int(supported) & pynvml.nvmlEventTypeXidCriticalError:
            self._mark_unsupported(gpu, "xid_events", "XID events not in the supported event types")
            return
        try:
            event_set = self._nvml.nvmlEventSetCreate()
            self._nvml.nvmlDeviceRegisterEvents(
                gpu.handle, pynvml.nvmlEventTypeXidCriticalError, event_set
            )
        except PERMANENT_ERRORS as exc:
            self._mark_unsupported(gpu, "xid_events", str(exc))
            return
        except pynvml.NVMLError as exc:
            log.warning("gpu %d: cannot register for XID events: %s", gpu.index, exc)
            return
        gpu.event_set = event_set

    def _mark_unsupported(self, gpu: _GpuState, key: str, why: str) -> None:
        gpu.unsupported.add(key)
        log.info("gpu %d: %s not supported (%s); not asking again", gpu.index, key, why)

    def _read(self, gpu: _GpuState, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call one NVML function for ``gpu``; None when the field is unavailable this round."""
        if key in gpu.unsupported:
            return None
        try:
            value = fn(*args)
        except pynvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost() from exc
        except PERMANENT_ERRORS as exc:
            self._mark_unsupported(gpu, key, str(exc))
            return None
        except pynvml.NVMLError as exc:
            if key not in gpu.failing:
                gpu.failing.add(key)
                log.warning(
                    "gpu %d: reading %s failed (%s: %s)", gpu.index, key, type(exc).__name__, exc
                )
            return None
        if key in gpu.failing:
            gpu.failing.discard(key)
            log.info("gpu %d: reading %s works again", gpu.index, key)
        return value

    def _collect_gpu(self, gpu: _GpuState, out: list[Sample]) -> None:
        now = self._clock()
        # Events first: the XID that announces a GPU falling off the bus comes before the loss.
        self._drain_xid_events(gpu)
        self._emit_xid(gpu, now, out)
        if gpu.handle is None and not self._init_handle(gpu):
            out.append(make_sample("gpu_lost", 1, now, self._labels(gpu)))
            return
        try:
            self._collect_fields(gpu, now, out)
        except _GpuLost:
            if not gpu.lost:
                log.error("gpu %d (%s) is lost: fallen off the bus", gpu.index, gpu.uuid)
            gpu.lost = True
            # Drop what this round read before the loss: a half-read GPU would mislead.
            out[:] = [
                s
                for s in out
                if s["labels"].get("gpu") != str(gpu.index) or s["name"].startswith("gpu_xid")
            ]
            out.append(make_sample("gpu_lost", 1, now, self._labels(gpu)))
            return
        if gpu.lost:
            log.warning("gpu %d (%s) answers again", gpu.index, gpu.uuid)
            gpu.lost = False
        out.append(make_sample("gpu_lost", 0, now, self._labels(gpu)))

    def _collect_fields(self, gpu: _GpuState, now: float, out: list[Sample]) -> None:
        nvml, h, labels = self._nvml, gpu.handle, self._labels(gpu)

        def add(name: str, value: float) -> None:
            out.append(make_sample(name, value, now, labels))

        out.append(
            make_sample("gpu_info", 1, now, self._labels(gpu, uuid=gpu.uuid, model=gpu.model))
        )
        util = self._read(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            add("gpu_utilization_ratio", util.gpu / 100.0)
            add("gpu_memory_utilization_ratio", util.memory / 100.0)
        mem = self._read(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            add("gpu_memory_used_bytes", mem.used)
            add("gpu_memory_total_bytes", mem.total)
        temp = self._read(
            gpu, "temperature", nvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU
        )
        if temp is not None:
            add("gpu_temperature_celsius", temp)
        power = self._read(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            add("gpu_power_watts", power / 1000.0)
        limit = self._read(gpu, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            add("gpu_power_limit_watts", limit / 1000.0)
        clock = self._read(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        if clock is not None:
            add("gpu_sm_clock_hertz", clock * 1e6)
        reasons = self._read(gpu, "throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if reasons is None and "throttle" in gpu.unsupported:
            # Newer drivers renamed the call ("clocks event reasons"); same bits.
            event_reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            if event_reasons is not None:
                reasons = self._read(gpu, "clock_events", event_reasons, h)
        if reasons is not None:
            for name, flag in throttle_flags(int(reasons)):
                add(name, flag)
        self._collect_memory_errors(gpu, now, out)
        replay = self._read(gpu, "pcie_replay", nvml.nvmlDeviceGetPcieReplayCounter, h)
        if replay is not None:
            add("gpu_pcie_replay_total", replay)
        self._collect_nvlink(gpu, now, out)

    def _collect_memory_errors(self, gpu: _GpuState, now: float, out: list[Sample]) -> None:
        nvml, h, labels = self._nvml, gpu.handle, self._labels(gpu)
        for key, name, error_type in (
            (
                "ecc_corrected",
                "gpu_ecc_corrected_errors_total",
                pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            ),
            (
                "ecc_uncorrected",
                "gpu_ecc_uncorrected_errors_total",
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            ),
        ):
            count = self._read(
                gpu, key, nvml.nvmlDeviceGetTotalEccErrors, h, error_type, pynvml.NVML_VOLATILE_ECC
            )
            if count is not None:
                out.append(make_sample(name, count, now, labels))
        for cause_label, cause in (
            ("single_bit_ecc", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
            ("double_bit_ecc", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        ):
            pages = self._read(gpu, "retired_pages", nvml.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                out.append(
                    make_sample(
                        "gpu_retired_pages_total",
                        len(pages),
                        now,
                        self._labels(gpu, cause=cause_label),
                    )
                )
        pending = self._read(
            gpu, "retired_pages_pending", nvml.nvmlDeviceGetRetiredPagesPendingStatus, h
        )
        if pending is not None:
            out.append(make_sample("gpu_retired_pages_pending", 1 if pending else 0, now, labels))
        rows = self._read(gpu, "remapped_rows", nvml.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, row_pending, failure = (int(v) for v in rows)
            out.append(make_sample("gpu_remapped_rows_corrected_total", corr, now, labels))
            out.append(make_sample("gpu_remapped_rows_uncorrected_total", unc, now, labels))
            out.append(
                make_sample("gpu_remapped_rows_pending", 1 if row_pending else 0, now, labels)
            )
            out.append(make_sample("gpu_remapped_rows_failure", 1 if failure else 0, now, labels))

    def _discover_nvlinks(self, gpu: _GpuState) -> list[int]:
        links: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self._nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost() from exc
            except PERMANENT_ERRORS as exc:
                if link == 0:
                    self._mark_unsupported(gpu, "nvlink", str(exc))
                break
            except pynvml.NVMLError:
                break  # past the last link of this GPU
            if state == pynvml.NVML_FEATURE_ENABLED:
                links.append(link)
        return links

    def _collect_nvlink(self, gpu: _GpuState, now: float, out: list[Sample]) -> None:
        if "nvlink" in gpu.unsupported:
            return
        if gpu.nvlink_links is None:
            gpu.nvlink_links = self._discover_nvlinks(gpu)
        if not gpu.nvlink_links:
            return
        if self._round % self._nvlink_every == 1 or self._nvlink_every == 1 or not gpu.nvlink_cache:
            totals: dict[str, int] = {}
            transient = False
            for bucket, counter_name, counter in _NVLINK_COUNTERS:
                key = f"nvlink_{counter_name}"
                for link in gpu.nvlink_links:
                    value = self._read(
                        gpu,
                        key,
                        self._nvml.nvmlDeviceGetNvLinkErrorCounter,
                        gpu.handle,
                        link,
                        counter,
                    )
                    if value is None:
                        # Unsupported counters (Hopper drops some DL counters) are left out; a
                        # transient failure keeps last round's sums rather than a partial one.
                        transient = transient or key not in gpu.unsupported
                        break
                    totals[bucket] = totals.get(bucket, 0) + int(value)
            if not transient:
                gpu.nvlink_cache = {name: float(v) for name, v in totals.items()}
        labels = self._labels(gpu)
        for name, value in gpu.nvlink_cache.items():
            out.append(make_sample(name, value, now, labels))

    # -- XID events ------------------------------------------------------------------------

    def _drain_xid_events(self, gpu: _GpuState) -> None:
        if gpu.event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_ROUND):
            try:
                data = self._nvml.nvmlEventSetWait(gpu.event_set, 0)
            except pynvml.NVMLError_Timeout:
                return  # no pending event: the normal case
            except pynvml.NVMLError as exc:
                log.debug("gpu %d: event wait failed: %s", gpu.index, exc)
                return
            if not int(data.eventType) & pynvml.nvmlEventTypeXidCriticalError:
                continue
            xid = int(data.eventData)
            gpu.last_xid = xid
            gpu.xids.record(xid, log, gpu.index, gpu.uuid)

    def _emit_xid(self, gpu: _GpuState, now: float, out: list[Sample]) -> None:
        if gpu.event_set is None:
            return
        out.extend(gpu.xids.samples(now, functools.partial(self._labels, gpu), gpu.last_xid))
