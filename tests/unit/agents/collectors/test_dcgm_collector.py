"""dcgm-exporter as the GPU source: field mapping, the XID field's limits, a GPU that is no
longer listed, an exporter that is down. The exporter's pages are recorded text in its format,
served through httpx's transport boundary (the real HTTP path is in the integration tests)."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from agents.collectors.dcgm import MAPPED_FIELDS, DcgmExporterCollector
from recovery.protocol.metric_names import GPU_METRICS
from recovery.protocol.samples import Sample
from tests.unit.agents.collectors.expositions import DCGM, set_value, without_gpu

MIB = 1024 * 1024


class Exporter:
    """The page the fake transport serves; ``None`` refuses the connection."""

    def __init__(self, page: str | None = DCGM) -> None:
        self.page = page

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.page is None:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, text=self.page)


def collector(exporter: Exporter) -> DcgmExporterCollector:
    c = DcgmExporterCollector("http://dcgm:9400/metrics", transport=httpx.MockTransport(exporter))
    c.start()
    return c


def value(samples: list[Sample], name: str, gpu: str = "0", **labels: str) -> float | None:
    found = [
        s["value"]
        for s in samples
        if s["name"] == name
        and s["labels"].get("gpu") == gpu
        and all(s["labels"].get(k) == v for k, v in labels.items())
    ]
    assert len(found) <= 1, (name, found)
    return found[0] if found else None


def test_fields_map_onto_the_agents_names_and_units() -> None:
    samples = collector(Exporter()).collect()
    assert {s["name"] for s in samples} <= GPU_METRICS
    assert value(samples, "gpu_utilization_ratio") == pytest.approx(0.97)
    assert value(samples, "gpu_memory_utilization_ratio") == pytest.approx(0.41)
    assert value(samples, "gpu_memory_used_bytes") == 60452 * MIB
    assert value(samples, "gpu_memory_total_bytes") == (60452 + 20480 + 579) * MIB
    assert value(samples, "gpu_temperature_celsius") == 61
    assert value(samples, "gpu_power_watts") == pytest.approx(512.337)
    assert value(samples, "gpu_power_limit_watts") == 700
    assert value(samples, "gpu_sm_clock_hertz") == 1980e6
    assert value(samples, "gpu_ecc_corrected_errors_total") == 3
    assert value(samples, "gpu_remapped_rows_corrected_total") == 1
    assert value(samples, "gpu_remapped_rows_failure") == 0
    assert value(samples, "gpu_nvlink_crc_errors_total") == 3  # flit 1 + data 2
    assert value(samples, "gpu_retired_pages_total", cause="double_bit_ecc") == 0
    assert value(samples, "gpu_throttle_reasons_bitmask") == 1  # GPU idle: no throttling flag
    assert value(samples, "gpu_throttle_thermal_active") == 0
    assert value(samples, "gpu_lost") == 0
    info = [s for s in samples if s["name"] == "gpu_info" and s["labels"]["gpu"] == "1"]
    assert info[0]["labels"]["uuid"] == "GPU-0e9d8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c61"
    assert info[0]["labels"]["model"] == "NVIDIA H100 80GB HBM3"


def test_blank_values_and_throttle_bits() -> None:
    page = set_value(DCGM, "DCGM_FI_DEV_GPU_TEMP", 9223372036854775794, gpu="0")
    page = set_value(page, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x40 | 0x4, gpu="0")
    c = collector(Exporter(page))
    samples = c.collect()
    assert value(samples, "gpu_temperature_celsius") is None  # DCGM's blank: not a reading
    assert value(samples, "gpu_temperature_celsius", gpu="1") == 58
    assert value(samples, "gpu_throttle_thermal_active") == 1
    assert value(samples, "gpu_throttle_power_active") == 1
    assert c.driver_versions() == {"driver": "550.90.07"}


def test_xid_field_counts_changes_only_and_its_first_value_is_a_baseline() -> None:
    exporter = Exporter()
    c = collector(exporter)
    first = c.collect()
    assert value(first, "gpu_xid_last_code", gpu="1") == 13  # an XID from before the agent
    assert value(first, "gpu_xid_critical_events_total", gpu="1") == 0
    assert value(first, "gpu_xid_events_total", gpu="1", xid="13") is None
    assert value(first, "gpu_xid_last_code", gpu="0") is None  # 0: no XID ever
    exporter.page = set_value(DCGM, "DCGM_FI_DEV_XID_ERRORS", 79, gpu="1")
    second = c.collect()
    assert value(second, "gpu_xid_events_total", gpu="1", xid="79") == 1
    assert value(second, "gpu_xid_critical_events_total", gpu="1") == 1
    assert value(second, "gpu_xid_last_code", gpu="1") == 79
    # The same code again is invisible in this field (documented as lost).
    assert value(c.collect(), "gpu_xid_events_total", gpu="1", xid="79") == 1


def test_a_gpu_no_longer_listed_is_lost_until_it_is_listed_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = Exporter()
    c = collector(exporter)
    c.collect()
    exporter.page = without_gpu(DCGM, "1")
    with caplog.at_level(logging.ERROR, logger="rlguard.agent.dcgm"):
        for _ in range(3):
            samples = c.collect()
            assert value(samples, "gpu_lost", gpu="1") == 1
            assert value(samples, "gpu_utilization_ratio", gpu="1") is None
            assert value(samples, "gpu_lost", gpu="0") == 0
    assert [r.getMessage() for r in caplog.records].count(
        "gpu 1 (GPU-0e9d8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c61) is no longer listed by dcgm-exporter: lost"
    ) == 1
    exporter.page = DCGM
    assert value(c.collect(), "gpu_lost", gpu="1") == 0


def test_an_exporter_that_is_down_is_logged_once_and_sends_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = Exporter(None)
    c = collector(exporter)
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.dcgm"):
        assert c.collect() == [] and c.collect() == []
        assert not c.available and "ConnectError" in (c.unavailable_reason or "")
        exporter.page = 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 5\n'  # malformed: still down
        assert c.collect() == []
        exporter.page = DCGM
        assert c.collect() and c.available
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is not answering" in m for m in messages) == 1
    assert sum("answers again" in m for m in messages) == 1


def test_shipped_counters_csv_enables_every_field_the_collector_reads() -> None:
    csv = Path(__file__).resolve().parents[4] / "deploy" / "dcgm" / "counters.csv"
    enabled: dict[str, str] = {}
    for line in csv.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        field, kind, help_text = (part.strip() for part in line.split(",", 2))
        assert field.startswith("DCGM_FI_") and kind in ("gauge", "counter", "label"), line
        assert help_text, line
        enabled[field] = kind
    assert MAPPED_FIELDS <= set(enabled), sorted(MAPPED_FIELDS - set(enabled))
    assert enabled["DCGM_FI_DRIVER_VERSION"] == "label"
