"""The NVML collector against the real library and a real GPU, and the fake held to it.

The agent's GPU health comes from ``agents.collectors.nvml.NvmlCollector``; everywhere without a
GPU it is tested against ``agents.fake_nvml.FakeNVML``. These tests show that the collector reads
live values from a real GPU and that the fake answers every call the way the real library does
(the same return types, the same exceptions), so the CPU-only tests mean something.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest
import torch

from agents.collectors.nvml import PERMANENT_ERRORS, NvmlCollector
from agents.fake_nvml import FakeNVML
from recovery.protocol.samples import Sample

GIB = 1 << 30


@pytest.fixture
def collector() -> Iterator[NvmlCollector]:
    c = NvmlCollector(pynvml)
    assert c.start(), c.unavailable_reason
    yield c
    c.close()


def gpu0(samples: list[Sample]) -> dict[str, float]:
    return {s["name"]: s["value"] for s in samples if s["labels"].get("gpu") == "0"}


def test_every_gpu_is_read_with_its_core_fields(collector: NvmlCollector) -> None:
    samples = collector.collect()
    count = torch.cuda.device_count()
    assert collector.gpu_count == count
    info = [s for s in samples if s["name"] == "gpu_info"]
    assert sorted(s["labels"]["gpu"] for s in info) == [str(i) for i in range(count)]
    props = torch.cuda.get_device_properties(0)
    assert info[0]["labels"]["model"] == props.name
    assert info[0]["labels"]["uuid"].startswith("GPU-")
    values = gpu0(samples)
    print("gpu 0 fields:", {k: values[k] for k in sorted(values)})
    for name in (
        "gpu_utilization_ratio",
        "gpu_memory_used_bytes",
        "gpu_memory_total_bytes",
        "gpu_temperature_celsius",
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_sm_clock_hertz",
    ):
        assert name in values, f"{name} missing from a real GPU's round: {sorted(values)}"
    # NVML counts the whole framebuffer, CUDA what it can hand out: within a few percent.
    assert abs(values["gpu_memory_total_bytes"] - props.total_memory) < 0.05 * props.total_memory
    assert 5 <= values["gpu_temperature_celsius"] <= 100
    assert 0 < values["gpu_power_watts"] <= values["gpu_power_limit_watts"] * 1.2
    assert 100e6 <= values["gpu_sm_clock_hertz"] <= 3e9
    assert collector.driver_versions()["driver"]


def test_readings_follow_what_the_gpu_does(collector: NvmlCollector) -> None:
    """Memory taken and kernels run show up in the next rounds: the values are live."""
    before = gpu0(collector.collect())
    block = torch.empty(8 * GIB, dtype=torch.uint8, device="cuda")
    block.fill_(1)
    torch.cuda.synchronize()
    held = gpu0(collector.collect())
    assert held["gpu_memory_used_bytes"] - before["gpu_memory_used_bytes"] >= 7.5 * GIB
    del block
    torch.cuda.empty_cache()

    stop = threading.Event()

    def busy() -> None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while not stop.is_set():
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        peak: dict[str, float] = {}
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = gpu0(collector.collect())
            for key in ("gpu_utilization_ratio", "gpu_power_watts"):
                peak[key] = max(peak.get(key, 0.0), now.get(key, 0.0))
    finally:
        stop.set()
        worker.join(30)
    print("idle:", {k: before.get(k) for k in peak}, "under load (peak):", peak)
    assert peak["gpu_utilization_ratio"] >= 0.5
    assert peak["gpu_power_watts"] > before["gpu_power_watts"]


# ---- the fake held to the real library ------------------------------------------------------


def _calls(nvml: Any, handle: Any) -> dict[str, Callable[[], Any]]:
    """Every call the collector makes, with the arguments it makes it with."""
    return {
        "nvmlSystemGetDriverVersion": lambda: nvml.nvmlSystemGetDriverVersion(),
        "nvmlSystemGetCudaDriverVersion": lambda: nvml.nvmlSystemGetCudaDriverVersion(),
        "nvmlDeviceGetCount": lambda: nvml.nvmlDeviceGetCount(),
        "nvmlDeviceGetUUID": lambda: nvml.nvmlDeviceGetUUID(handle),
        "nvmlDeviceGetName": lambda: nvml.nvmlDeviceGetName(handle),
        "nvmlDeviceGetUtilizationRates": lambda: nvml.nvmlDeviceGetUtilizationRates(handle),
        "nvmlDeviceGetMemoryInfo": lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
        "nvmlDeviceGetTemperature": lambda: nvml.nvmlDeviceGetTemperature(
            handle, pynvml.NVML_TEMPERATURE_GPU
        ),
        "nvmlDeviceGetPowerUsage": lambda: nvml.nvmlDeviceGetPowerUsage(handle),
        "nvmlDeviceGetEnforcedPowerLimit": lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle),
        "nvmlDeviceGetClockInfo": lambda: nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda: (
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        ),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: (
            nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        ),
        "nvmlDeviceGetTotalEccErrors": lambda: nvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        ),
        "nvmlDeviceGetRetiredPages": lambda: nvml.nvmlDeviceGetRetiredPages(
            handle, pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        ),
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda: (
            nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle)
        ),
        "nvmlDeviceGetRemappedRows": lambda: nvml.nvmlDeviceGetRemappedRows(handle),
        "nvmlDeviceGetPcieReplayCounter": lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle),
        "nvmlDeviceGetNvLinkState": lambda: nvml.nvmlDeviceGetNvLinkState(handle, 0),
        "nvmlDeviceGetNvLinkErrorCounter": lambda: nvml.nvmlDeviceGetNvLinkErrorCounter(
            handle, 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
        ),
        "nvmlDeviceGetSupportedEventTypes": lambda: nvml.nvmlDeviceGetSupportedEventTypes(handle),
    }


# A real call may raise what the collector takes as "this GPU lacks the field" (the fake models
# it with mark_unsupported); anything else would be a contract difference.


def _shape(value: Any) -> Any:
    """What a caller relies on in a return value: its type, and for ctypes structures the fields."""
    if isinstance(value, ctypes.Structure):
        return (type(value).__name__, sorted(name for name, *_ in type(value)._fields_))
    if isinstance(value, (list, tuple)):
        return (
            type(value).__name__,
            sorted({type(v).__name__ for v in value}),
            len(value) if isinstance(value, tuple) else None,
        )
    return type(value).__name__


def test_the_fake_answers_every_call_as_the_real_library_does() -> None:
    fake = FakeNVML(1)
    fake.nvmlInit()
    pynvml.nvmlInit()
    try:
        real_calls = _calls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        fake_calls = _calls(fake, fake.nvmlDeviceGetHandleByIndex(0))
        # Every nvml* function the fake offers is exercised here (nothing unchecked slips in).
        offered = {n for n in dir(fake) if n.startswith("nvml")}
        lifecycle = {
            "nvmlInit",
            "nvmlShutdown",
            "nvmlDeviceGetHandleByIndex",
            "nvmlEventSetCreate",
            "nvmlDeviceRegisterEvents",
            "nvmlEventSetWait",
            "nvmlEventSetFree",
        }
        assert offered - lifecycle == set(real_calls), offered - lifecycle ^ set(real_calls)
        table = []
        for name, call in real_calls.items():
            fake_shape = _shape(fake_calls[name]())
            try:
                real_shape = _shape(call())
            except PERMANENT_ERRORS as exc:
                table.append(
                    f"{name}: real {type(exc).__name__} (the field is skipped on this GPU)"
                )
                continue
            table.append(f"{name}: {real_shape}")
            assert real_shape == fake_shape, (
                f"{name}: real returns {real_shape}, the fake {fake_shape}"
            )
        print("\n".join(table))
    finally:
        pynvml.nvmlShutdown()


def test_before_init_both_raise_uninitialized() -> None:
    # In a fresh process: NVML counts initialisations library-wide, and torch's CUDA runtime
    # initialises it in this one without shutting it down.
    probe = (
        "import pynvml\n"
        "try:\n    pynvml.nvmlDeviceGetCount()\nexcept pynvml.NVMLError as exc:\n"
        "    print(type(exc).__name__)\nelse:\n    print('no error')\n"
    )
    real = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert real.stdout.strip() == "NVMLError_Uninitialized", real.stdout + real.stderr
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNVML(1).nvmlDeviceGetCount()


def test_the_fake_raises_what_the_real_library_raises() -> None:
    fake = FakeNVML(1)
    for nvml in (pynvml, fake):
        nvml.nvmlInit()
        try:
            count = nvml.nvmlDeviceGetCount()
            with pytest.raises(pynvml.NVMLError_InvalidArgument):
                nvml.nvmlDeviceGetHandleByIndex(count)
            handle = nvml.nvmlDeviceGetHandleByIndex(0)
            # XID events: register what the GPU supports, then a wait with nothing pending times
            # out (how the collector drains events without blocking a round).
            events = nvml.nvmlEventSetCreate()
            supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
            wanted = supported & pynvml.nvmlEventTypeXidCriticalError
            print(f"{getattr(nvml, '__name__', type(nvml).__name__)}: event mask {supported:#x}")
            if wanted:
                nvml.nvmlDeviceRegisterEvents(handle, wanted, events)
                with pytest.raises(pynvml.NVMLError_Timeout):
                    nvml.nvmlEventSetWait(events, 1)
            nvml.nvmlEventSetFree(events)
        finally:
            nvml.nvmlShutdown()
