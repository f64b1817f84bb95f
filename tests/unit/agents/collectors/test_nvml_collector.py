"""The NVML collector against the faithful fake (real pynvml exception classes and structs)."""

from __future__ import annotations

import logging

import pynvml
import pytest

from agents.collectors.nvml import NvmlCollector
from agents.fake_nvml import FakeNVML
from recovery.protocol.metric_names import GPU_METRICS


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def by_name(samples: list, name: str, gpu: int | None = None) -> list:
    return [
        s for s in samples if s["name"] == name and (gpu is None or s["labels"]["gpu"] == str(gpu))
    ]


def value(samples: list, name: str, gpu: int = 0) -> float:
    found = by_name(samples, name, gpu)
    assert len(found) == 1, (name, gpu, found)
    return found[0]["value"]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def started(fake: FakeNVML, clock: Clock, **kw: object) -> NvmlCollector:
    col = NvmlCollector(fake, clock=clock, **kw)  # type: ignore[arg-type]
    assert col.start()
    return col


def test_fake_uses_real_pynvml_types() -> None:
    fake = FakeNVML(1)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(h), pynvml.c_nvmlMemory_t)
    assert isinstance(fake.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    es = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(es, 0)
    fake.inject_xid(0, 31)
    data = fake.nvmlEventSetWait(es, 0)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 31)
    # The real library maps codes to these subclasses: the fake raises exactly those.
    assert pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST).__class__ is pynvml.NVMLError_GpuIsLost
    fake.lose_gpu(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)


def test_healthy_round_has_every_documented_field(clock: Clock) -> None:
    fake = FakeNVML(2, clock=clock)
    fake.gpus[1].utilization_override = 50
    col = started(fake, clock)
    samples = col.collect()
    names = {s["name"] for s in samples}
    assert names <= GPU_METRICS
    assert names == GPU_METRICS - {"gpu_xid_events_total", "gpu_xid_last_code"}
    assert value(samples, "gpu_utilization_ratio", 1) == 0.5
    assert value(samples, "gpu_memory_utilization_ratio", 1) == 0.3
    assert value(samples, "gpu_memory_total_bytes", 1) == 80 * 1024**3
    used = value(samples, "gpu_memory_used_bytes", 1)
    assert 0 < used < 80 * 1024**3
    assert value(samples, "gpu_temperature_celsius", 1) == 54
    assert value(samples, "gpu_power_watts", 1) == pytest.approx(370.0)
    assert value(samples, "gpu_power_limit_watts", 1) == 700.0
    assert value(samples, "gpu_sm_clock_hertz", 1) == 1980e6
    assert value(samples, "gpu_throttle_thermal_active", 1) == 0
    assert value(samples, "gpu_lost", 1) == 0
    info = by_name(samples, "gpu_info", 1)[0]
    assert info["labels"]["uuid"] == fake.gpus[1].uuid
    assert info["labels"]["model"] == "NVIDIA H100 80GB HBM3"
    # uuid only on gpu_info; no simulated label unless asked for.
    assert all("uuid" not in s["labels"] for s in samples if s["name"] != "gpu_info")
    assert all("simulated" not in s["labels"] for s in samples)
    assert all(s["ts"] == clock.now for s in samples)


def test_simulated_label_on_every_sample(clock: Clock) -> None:
    col = started(FakeNVML(2, clock=clock), clock, simulated=True)
    samples = col.collect()
    assert samples and all(s["labels"]["simulated"] == "1" for s in samples)


def test_xid_event_is_counted_and_critical_flagged(clock: Clock) -> None:
    fake = FakeNVML(2, clock=clock)
    col = started(fake, clock)
    col.collect()
    fake.inject_xid(1, 13)  # graphics engine exception: not critical
    fake.inject_xid(1, 94)
    fake.inject_xid(1, 94)
    s = col.collect()
    counts = {x["labels"]["xid"]: x["value"] for x in by_name(s, "gpu_xid_events_total", 1)}
    assert counts == {"13": 1, "94": 2}
    assert value(s, "gpu_xid_critical_events_total", 1) == 2
    assert value(s, "gpu_xid_last_code", 1) == 94
    assert value(s, "gpu_xid_critical_events_total", 0) == 0
    # counters persist on later rounds without new events
    s = col.collect()
    assert value(s, "gpu_xid_critical_events_total", 1) == 2


def test_gpu_falls_off_the_bus_mid_run_and_the_rest_keep_reporting(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNVML(3, clock=clock)
    col = started(fake, clock)
    assert value(col.collect(), "gpu_lost", 2) == 0
    fake.inject_xid(2, 79)  # XID 79 and the GPU is gone
    with caplog.at_level(logging.INFO, logger="rlguard.agent.nvml"):
        s = col.collect()
        s2 = col.collect()
    for round_ in (s, s2):
        assert value(round_, "gpu_lost", 2) == 1
        gpu2 = {x["name"] for x in round_ if x["labels"]["gpu"] == "2"}
        assert gpu2 == {
            "gpu_lost",
            "gpu_xid_events_total",
            "gpu_xid_critical_events_total",
            "gpu_xid_last_code",
        }
        assert value(round_, "gpu_xid_last_code", 2) == 79
        assert value(round_, "gpu_lost", 0) == 0
        assert value(round_, "gpu_temperature_celsius", 1) > 0
    lost_logs = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost_logs) == 1  # reported once, not every round
    fake.restore_gpu(2)
    s3 = col.collect()
    assert value(s3, "gpu_lost", 2) == 0
    assert value(s3, "gpu_temperature_celsius", 2) > 0


def test_unsupported_fields_skipped_once_per_gpu_without_log_spam(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNVML(2, clock=clock)
    fake.mark_unsupported(0, "nvmlDeviceGetTotalEccErrors")
    fake.mark_unsupported(0, "nvmlDeviceGetRemappedRows")
    fake.mark_unsupported(0, "nvmlDeviceGetNvLinkState")
    col = started(fake, clock)
    with caplog.at_level(logging.INFO, logger="rlguard.agent.nvml"):
        rounds = [col.collect() for _ in range(5)]
    for s in rounds:
        names0 = {x["name"] for x in s if x["labels"]["gpu"] == "0"}
        assert "gpu_ecc_uncorrected_errors_total" not in names0
        assert "gpu_remapped_rows_failure" not in names0
        assert "gpu_nvlink_crc_errors_total" not in names0
        assert "gpu_temperature_celsius" in names0
        assert value(s, "gpu_ecc_uncorrected_errors_total", 1) == 0
        assert value(s, "gpu_nvlink_crc_errors_total", 1) == 0
    messages = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    # ecc_corrected, ecc_uncorrected, remapped_rows, nvlink: one line each, over five rounds
    assert len(messages) == 4, messages
    calls_before = fake.calls
    col.collect()
    calls_one_round = fake.calls - calls_before
    fake2 = FakeNVML(2, clock=clock)
    col2 = started(fake2, clock)
    col2.collect()
    before2 = fake2.calls
    col2.collect()
    assert calls_one_round < fake2.calls - before2  # it really stopped asking


def test_uncorrectable_ecc_and_thermal_throttle(clock: Clock) -> None:
    fake = FakeNVML(1, clock=clock)
    col = started(fake, clock)
    col.collect()
    fake.inject_uncorrectable_ecc(0, 2)
    fake.set_thermal_throttle(0, True)
    s = col.collect()
    assert value(s, "gpu_ecc_uncorrected_errors_total") == 2
    assert value(s, "gpu_remapped_rows_uncorrected_total") == 2
    assert value(s, "gpu_remapped_rows_pending") == 1
    assert value(s, "gpu_retired_pages_pending") == 1
    assert value(s, "gpu_xid_last_code") == 48
    assert value(s, "gpu_throttle_thermal_active") == 1
    assert value(s, "gpu_throttle_power_active") == 0
    bits = int(value(s, "gpu_throttle_reasons_bitmask"))
    assert bits & pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    assert value(s, "gpu_sm_clock_hertz") == 1410e6
    fake.set_thermal_throttle(0, False)
    assert value(col.collect(), "gpu_throttle_thermal_active") == 0


def test_nvlink_errors_summed_over_active_links(clock: Clock) -> None:
    fake = FakeNVML(1, clock=clock)
    fake.gpus[0].nvlink_errors = {
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 3,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 4,
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 5,
    }
    col = started(fake, clock, nvlink_every=1)
    s = col.collect()
    assert value(s, "gpu_nvlink_crc_errors_total") == 7
    assert value(s, "gpu_nvlink_replay_errors_total") == 5
    assert value(s, "gpu_nvlink_recovery_errors_total") == 0
    assert len(by_name(s, "gpu_nvlink_crc_errors_total")) == 1  # one series, not one per link


@pytest.mark.parametrize(
    "kw", [{"library_missing": True}, {"driver_not_loaded": True}], ids=["no-library", "no-driver"]
)
def test_no_nvml_is_reported_once_and_collect_returns_nothing(
    clock: Clock, caplog: pytest.LogCaptureFixture, kw: dict
) -> None:
    fake = FakeNVML(4, clock=clock, **kw)
    col = NvmlCollector(fake, clock=clock, init_retry_s=10)
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.nvml"):
        assert not col.start()
        for _ in range(30):
            clock.now += 1
            assert col.collect() == []
    assert not col.available
    assert "NVMLError_" in (col.unavailable_reason or "")
    warnings = [r for r in caplog.records if "NVML is not available" in r.getMessage()]
    assert len(warnings) == 1
    # the driver appears later: the periodic retry picks it up
    fake.library_missing = fake.driver_not_loaded = False
    clock.now += 10
    assert by_name(col.collect(), "gpu_lost", 3)


def test_real_pynvml_without_a_driver_reports_unavailable(clock: Clock) -> None:
    """On this machine (no NVIDIA driver) the real library must take the same path."""
    col = NvmlCollector(pynvml, clock=clock)
    if col.start():  # a GPU machine: the collector must then produce real samples
        try:
            assert by_name(col.collect(), "gpu_lost")
        finally:
            col.close()
    else:
        assert col.unavailable_reason is not None
        assert col.collect() == []


def test_close_frees_event_sets_and_shuts_down(clock: Clock) -> None:
    fake = FakeNVML(2, clock=clock)
    col = started(fake, clock)
    col.close()
    assert fake.initialized == 0
    assert not col.available


def test_nvlink_counter_a_gpu_lacks_is_left_out_and_the_others_kept(clock: Clock) -> None:
    fake = FakeNVML(1, clock=clock)
    fake.gpus[0].nvlink_errors = {
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 2,
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 1,
    }
    fake.gpus[0].nvlink_unsupported_counters = {
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
    }
    col = started(fake, clock, nvlink_every=1)
    for _ in range(2):
        s = col.collect()
        assert value(s, "gpu_nvlink_crc_errors_total") == 2
        assert value(s, "gpu_nvlink_replay_errors_total") == 1
        assert by_name(s, "gpu_nvlink_recovery_errors_total") == []


def test_throttle_reasons_fall_back_to_the_renamed_call(clock: Clock) -> None:
    fake = FakeNVML(1, clock=clock)
    fake.mark_unsupported(0, "nvmlDeviceGetCurrentClocksThrottleReasons")
    fake.set_thermal_throttle(0, True)
    col = started(fake, clock)
    for _ in range(2):
        assert value(col.collect(), "gpu_throttle_thermal_active") == 1
