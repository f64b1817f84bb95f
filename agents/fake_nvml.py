"""A faithful stand-in for the ``pynvml`` (nvidia-ml-py) functions the agent calls.

Used by the unit tests and, promoted to a feature, by ``--simulate-gpus N`` on machines without
GPUs. It keeps the real library's contract rather than inventing a friendlier one:

- the same function names and argument order (``nvmlDeviceGetTotalEccErrors(handle, errorType,
  counterType)``), the same constants (taken from ``pynvml`` itself);
- the real ``pynvml`` exception classes (``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``,
  ``NVMLError_LibraryNotFound``, ``NVMLError_Uninitialized``, ``NVMLError_Timeout`` ...);
- the real ctypes structures as return values (``c_nvmlMemory_t`` with ``.total/.free/.used``,
  ``c_nvmlUtilization_t`` with ``.gpu/.memory``, ``c_nvmlEventData_t`` with
  ``.eventType/.eventData``), milliwatts for power, MHz for clocks, strings for UUIDs.

Faults are injected through methods (``inject_xid``, ``inject_uncorrectable_ecc``,
``set_thermal_throttle``, ``lose_gpu``, ``mark_unsupported``) while a collector is using it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml

_GIB = 1024**3


@dataclass(eq=False)
class FakeHandle:
    """Opaque device handle, like ``pynvml.c_nvmlDevice_t``."""

    index: int


@dataclass(eq=False)
class FakeEventSet:
    """Opaque event set, like ``pynvml.c_nvmlEventSet_t``."""

    registrations: list[tuple[int, int]] = field(default_factory=list)  # (gpu index, event mask)
    freed: bool = False


@dataclass
class FakeGpu:
    """The mutable state of one simulated GPU."""

    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * _GIB
    power_limit_mw: int = 700_000
    throttle_reasons: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    retired_pages: dict[int, list[int]] = field(default_factory=lambda: {0: [], 1: []})
    retired_pending: int = 0
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    pcie_replay: int = 0
    nvlink_active: int = 18
    nvlink_errors: dict[int, int] = field(default_factory=dict)  # counter type -> total
    nvlink_unsupported_counters: set[int] = field(default_factory=set)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    events: deque[tuple[int, int]] = field(default_factory=deque)  # (event type, data)
    supported_events: int = (
        pynvml.nvmlEventTypeXidCriticalError
        | pynvml.nvmlEventTypeSingleBitEccError
        | pynvml.nvmlEventTypeDoubleBitEccError
    )
    utilization_override: int | None = None


class FakeNVML:
    """Simulated NVML with ``count`` GPUs; ``clock`` drives the simulated load curve."""

    def __init__(
        self,
        count: int,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        library_missing: bool = False,
        driver_not_loaded: bool = False,
    ) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.gpus = [
            FakeGpu(index=i, uuid=f"GPU-5a1e{seed:04x}-{i:04x}-4c8b-9d2e-00000000{i:04x}")
            for i in range(count)
        ]
        self._rng = random.Random(seed)
        self._clock = clock
        self._lock = threading.Lock()
        self.library_missing = library_missing
        self.driver_not_loaded = driver_not_loaded
        self.initialized = 0
        self.calls = 0

    # -- fault injection -------------------------------------------------------------------

    def inject_xid(self, gpu: int, xid: int) -> None:
        """Queue an XID event on ``gpu``; XID 79 also makes the GPU fall off the bus."""
        with self._lock:
            target = self.gpus[gpu]
            target.events.append((pynvml.nvmlEventTypeXidCriticalError, xid))
            if xid == 79:
                target.lost = True

    def inject_uncorrectable_ecc(self, gpu: int, count: int = 1) -> None:
        """Add ``count`` uncorrectable (double-bit) ECC errors to ``gpu``, with the XID 48 event."""
        with self._lock:
            target = self.gpus[gpu]
            target.ecc_uncorrected += count
            target.retired_pending = 1
            corr, unc, _pending, failure = target.remapped_rows
            target.remapped_rows = (corr, unc + count, 1, failure)
            target.events.append((pynvml.nvmlEventTypeXidCriticalError, 48))

    def set_thermal_throttle(self, gpu: int, on: bool) -> None:
        """Turn the thermal slowdown throttle reasons of ``gpu`` on or off."""
        bits = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown | (
            pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
        )
        with self._lock:
            target = self.gpus[gpu]
            if on:
                target.throttle_reasons |= bits
            else:
                target.throttle_reasons &= ~bits

    def lose_gpu(self, gpu: int) -> None:
        """Make every later call for ``gpu`` raise ``NVMLError_GpuIsLost`` (fallen off the bus)."""
        with self._lock:
            self.gpus[gpu].lost = True

    def restore_gpu(self, gpu: int) -> None:
        """Bring a lost ``gpu`` back (as after a reset)."""
        with self._lock:
            self.gpus[gpu].lost = False

    def mark_unsupported(self, gpu: int, function_name: str) -> None:
        """Make ``function_name`` raise ``NVMLError_NotSupported`` for ``gpu``."""
        with self._lock:
            self.gpus[gpu].unsupported.add(function_name)

    # -- library lifecycle -----------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - the real library's name
        if self.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        if self.driver_not_loaded:
            raise pynvml.NVMLError_DriverNotLoaded()
        self.initialized += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._require_init()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        self._require_init()
        return "550.90.07"

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802
        self._require_init()
        return 12040

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._require_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:  # noqa: N802
        self._require_init()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return FakeHandle(index)

    # -- per-device queries ----------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> pynvml.c_nvmlUtilization_t:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        util = self._utilization(gpu)
        return pynvml.c_nvmlUtilization_t(gpu=util, memory=max(0, util - 20))

    def nvmlDeviceGetMemoryInfo(
        self, handle: FakeHandle, version: int | None = None
    ) -> pynvml.c_nvmlMemory_t:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        used = int(gpu.memory_total * (0.55 + 0.3 * self._utilization(gpu) / 100))
        return pynvml.c_nvmlMemory_t(
            total=gpu.memory_total, free=gpu.memory_total - used, used=used
        )

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        hot = 25 if gpu.throttle_reasons & pynvml.nvmlClocksThrottleReasonHwThermalSlowdown else 0
        return int(34 + 0.4 * self._utilization(gpu)) + hot

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:  # noqa: N802
        gpu = self._gpu(handle, "nvmlDeviceGetPowerUsage")
        return int(90_000 + 5_600 * self._utilization(gpu))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:  # noqa: A002, N802
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type != pynvml.NVML_CLOCK_SM:
            return 1593
        return 1410 if gpu.throttle_reasons else 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").throttle_reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").throttle_reasons

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeHandle, errorType: int, counterType: int
    ) -> int:  # noqa: N802, N803
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        if errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetRetiredPages(self, device: FakeHandle, sourceFilter: int) -> list[int]:  # noqa: N802, N803
        gpu = self._gpu(device, "nvmlDeviceGetRetiredPages")
        if sourceFilter not in gpu.retired_pages:
            raise pynvml.NVMLError_InvalidArgument()
        return list(gpu.retired_pages[sourceFilter])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: FakeHandle) -> int:  # noqa: N802
        return self._gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetRemappedRows(self, device: FakeHandle) -> tuple[int, int, int, int]:  # noqa: N802
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetNvLinkState(self, device: FakeHandle, link: int) -> int:  # noqa: N802
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED if link < gpu.nvlink_active else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, device: FakeHandle, link: int, counter: int) -> int:  # noqa: N802
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < gpu.nvlink_active:
            raise pynvml.NVMLError_InvalidArgument()
        if counter in gpu.nvlink_unsupported_counters:
            raise pynvml.NVMLError_NotSupported()
        # The simulated errors all sit on link 0, as a single bad cable would.
        return gpu.nvlink_errors.get(counter, 0) if link == 0 else 0

    # -- events ----------------------------------------------------------------------------

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:  # noqa: N802
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlEventSetCreate(self) -> FakeEventSet:  # noqa: N802
        self._require_init()
        return FakeEventSet()

    def nvmlDeviceRegisterEvents(
        self, handle: FakeHandle, eventTypes: int, eventSet: FakeEventSet
    ) -> None:  # noqa: N802, N803
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~gpu.supported_events:
            raise pynvml.NVMLError_NotSupported()
        eventSet.registrations.append((gpu.index, eventTypes))

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> pynvml.c_nvmlEventData_t:  # noqa: N802
        self._require_init()
        if eventSet.freed:
            raise pynvml.NVMLError_InvalidArgument()
        with self._lock:
            for index, mask in eventSet.registrations:
                queue = self.gpus[index].events
                for position, (event_type, data) in enumerate(queue):
                    if event_type & mask:
                        del queue[position]
                        return pynvml.c_nvmlEventData_t(eventType=event_type, eventData=data)
        # The real call blocks up to timeoutms and then raises NVML_ERROR_TIMEOUT.
        raise pynvml.NVMLError_Timeout()

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:  # noqa: N802
        eventSet.freed = True

    # -- internals -------------------------------------------------------------------------

    def _require_init(self) -> None:
        self.calls += 1
        if self.initialized <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: FakeHandle, function_name: str) -> FakeGpu:
        self._require_init()
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if function_name in gpu.unsupported:
            raise pynvml.NVMLError_NotSupported()
        return gpu

    def _utilization(self, gpu: FakeGpu) -> int:
        if gpu.utilization_override is not None:
            return gpu.utilization_override
        # A slow swing between rollout-like and train-like load, with a little noise.
        phase = self._clock() / 30.0 + gpu.index
        base = 70 + 25 * math.sin(phase)
        return max(0, min(100, int(base + self._rng.uniform(-3, 3))))
