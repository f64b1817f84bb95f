"""GPU health from NVIDIA's dcgm-exporter instead of NVML (``--gpu-source dcgm-exporter``).

The shop already runs dcgm-exporter for Prometheus; the agent scrapes the same page
(``--dcgm-url``, default ``http://127.0.0.1:9400/metrics``) and maps its ``DCGM_FI_*`` fields onto
the agent's own metric names (the table in ``docs/metrics.md``), so detectors, dashboards and
alert rules work the same whichever source fed them. Format checked against dcgm-exporter
4.5.3-4.8.2 (``internal/pkg/rendermetrics/render_metrics.go``: one sample per GPU labelled
``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, optional ``Hostname``).

What differs from NVML, on purpose and documented:

- ``DCGM_FI_DEV_XID_ERRORS`` holds only the newest XID code. A change of that value is counted
  as one XID event; two XIDs between two scrapes count once, and the same XID repeated is not
  seen. The value found at the first scrape is a baseline, not an event.
- A GPU that was listed and is missing from a later page is reported ``gpu_lost 1`` (the
  exporter stops listing a device DCGM lost) until it is listed again.
- An exporter that does not answer (refused, timeout, HTTP error, malformed page) is logged once;
  no GPU samples are sent while it is down, and the job signals keep flowing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from agents.collectors.exposition import (
    ExpositionReader,
    ExpositionSample,
    ScrapeError,
    by_name,
    scrape,
)
from agents.collectors.gpu_source import GpuSource, XidTally, throttle_flags
from recovery.protocol.samples import Sample, make_sample

log = logging.getLogger("rlguard.agent.dcgm")

DEFAULT_DCGM_URL = "http://127.0.0.1:9400/metrics"
# DCGM renders a field it has no value for as its "blank" sentinel (DCGM_INT32_BLANK =
# 0x7ffffff0 and up, DCGM_INT64_BLANK and DCGM_FP64_BLANK are larger still): never a reading.
_BLANK_FROM = float(0x7FFFFFF0)
_MIB = 1024 * 1024

# DCGM field → (our name, scale). Every name here is in recovery.protocol.metric_names.GPU_METRICS.
_DIRECT: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", 0.01),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_utilization_ratio", 0.01),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", _MIB),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("gpu_power_limit_watts", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_hertz", 1e6),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("gpu_ecc_corrected_errors_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("gpu_ecc_uncorrected_errors_total", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_corrected_total", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("gpu_remapped_rows_uncorrected_total", 1.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("gpu_pcie_replay_total", 1.0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("gpu_nvlink_replay_errors_total", 1.0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("gpu_nvlink_recovery_errors_total", 1.0),
}
# Fields that become a 0/1 flag (any non-zero value is 1).
_FLAGS: dict[str, str] = {
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gpu_remapped_rows_failure",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "gpu_remapped_rows_pending",
    "DCGM_FI_DEV_RETIRED_PENDING": "gpu_retired_pages_pending",
}
_RETIRED = {
    "DCGM_FI_DEV_RETIRED_SBE": "single_bit_ecc",
    "DCGM_FI_DEV_RETIRED_DBE": "double_bit_ecc",
}
_NVLINK_CRC = (
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
)
# The clock-event (formerly throttle) reasons bitmask; DCGM renamed the field, same bits as NVML.
_CLOCK_EVENTS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# Every field the collector reads (deploy/dcgm/counters.csv must enable each of them).
MAPPED_FIELDS: frozenset[str] = frozenset(
    {*_DIRECT, *_FLAGS, *_RETIRED, *_NVLINK_CRC, _CLOCK_EVENTS[0]}
    | {"DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_XID_ERRORS"}
)


@dataclass
class _GpuState:
    index: str
    uuid: str = "unknown"
    model: str = "unknown"
    lost: bool = False
    last_xid: int | None = None  # newest XID code seen (the baseline at the first scrape)
    xids: XidTally = field(default_factory=XidTally)


class DcgmExporterCollector(GpuSource):
    """Samples every GPU the exporter lists; same interface as ``NvmlCollector``."""

    def __init__(
        self,
        url: str = DEFAULT_DCGM_URL,
        *,
        timeout: float = 1.0,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self._clock = clock
        self._client = httpx.Client(timeout=timeout, transport=transport)
        self._gpus: dict[str, _GpuState] = {}
        # Only the fields mapped below are read; the rest of the page is skipped unparsed.
        self._reader = ExpositionReader(tuple(sorted(MAPPED_FIELDS | set(_CLOCK_EVENTS))))
        self._available = False
        self._unavailable_reason: str | None = None
        self._driver: str | None = None

    def start(self) -> bool:
        """Nothing to initialise: the first :meth:`collect` scrapes. Always True."""
        log.info("GPU source: dcgm-exporter at %s", self.url)
        return True

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def driver_versions(self) -> dict[str, str]:
        """The driver version from the exporter's ``DCGM_FI_DRIVER_VERSION`` label, if shown."""
        return {"driver": self._driver} if self._driver else {}

    def collect(self) -> list[Sample]:
        """Scrape once and return this round's GPU samples (none while the exporter is down)."""
        try:
            samples = scrape(self._client, self.url, self._reader)
        except ScrapeError as exc:
            self._mark_down(str(exc))
            return []
        per_gpu: dict[str, list[ExpositionSample]] = {}
        for s in samples:
            index = s.labels.get("gpu")
            if index is not None and index.isdigit():
                per_gpu.setdefault(index, []).append(s)
        if self._unavailable_reason is not None:
            log.warning("dcgm-exporter at %s answers again", self.url)
        self._available = True
        self._unavailable_reason = None
        now = self._clock()
        out: list[Sample] = []
        for index in sorted(set(per_gpu) | set(self._gpus), key=int):
            gpu = self._gpus.setdefault(index, _GpuState(index=index))
            fields = per_gpu.get(index)
            if not fields:
                self._report_lost(gpu, now, out)
                continue
            if gpu.lost:
                log.warning("gpu %s (%s) is listed by dcgm-exporter again", index, gpu.uuid)
                gpu.lost = False
            self._collect_gpu(gpu, by_name(fields), now, out)
        return out

    def _mark_down(self, reason: str) -> None:
        if self._unavailable_reason is None:
            log.warning(
                "dcgm-exporter is not answering (%s); sending no GPU metrics until it does, "
                "job signals continue",
                reason,
            )
        self._available = False
        self._unavailable_reason = reason

    def _report_lost(self, gpu: _GpuState, now: float, out: list[Sample]) -> None:
        if not gpu.lost:
            log.error("gpu %s (%s) is no longer listed by dcgm-exporter: lost", gpu.index, gpu.uuid)
            gpu.lost = True
        out.append(make_sample("gpu_lost", 1, now, {"gpu": gpu.index}))

    def _collect_gpu(
        self,
        gpu: _GpuState,
        fields: dict[str, list[ExpositionSample]],
        now: float,
        out: list[Sample],
    ) -> None:
        labels = {"gpu": gpu.index}

        def value(name: str) -> float | None:
            # The parser names a counter's samples with "_total" whether the page did or not.
            found = fields.get(name) or fields.get(name + "_total")
            if not found or found[0].value >= _BLANK_FROM or found[0].value < 0:
                return None
            return found[0].value

        def add(name: str, v: float, extra: dict[str, str] | None = None) -> None:
            out.append(make_sample(name, v, now, {**labels, **extra} if extra else labels))

        first = next(iter(fields.values()))[0].labels
        gpu.uuid = first.get("UUID") or first.get("uuid") or gpu.uuid
        gpu.model = first.get("modelName") or gpu.model
        self._driver = first.get("DCGM_FI_DRIVER_VERSION") or self._driver
        add("gpu_info", 1, {"uuid": gpu.uuid, "model": gpu.model})
        for dcgm_name, (ours, scale) in _DIRECT.items():
            v = value(dcgm_name)
            if v is not None:
                add(ours, v * scale)
        used, free = value("DCGM_FI_DEV_FB_USED"), value("DCGM_FI_DEV_FB_FREE")
        if used is not None and free is not None:
            reserved = value("DCGM_FI_DEV_FB_RESERVED") or 0.0
            add("gpu_memory_total_bytes", (used + free + reserved) * _MIB)
        for dcgm_name, ours in _FLAGS.items():
            v = value(dcgm_name)
            if v is not None:
                add(ours, 1 if v > 0 else 0)
        for dcgm_name, cause in _RETIRED.items():
            v = value(dcgm_name)
            if v is not None:
                add("gpu_retired_pages_total", v, {"cause": cause})
        crc = [v for v in (value(n) for n in _NVLINK_CRC) if v is not None]
        if crc:
            add("gpu_nvlink_crc_errors_total", sum(crc))
        for dcgm_name in _CLOCK_EVENTS:
            v = value(dcgm_name)
            if v is not None:
                for name, flag in throttle_flags(int(v)):
                    add(name, flag)
                break
        self._xid(gpu, value("DCGM_FI_DEV_XID_ERRORS"), now, out)
        add("gpu_lost", 0)

    def _xid(self, gpu: _GpuState, code: float | None, now: float, out: list[Sample]) -> None:
        if code is None:
            return
        xid = int(code)
        first_sight = gpu.last_xid is None
        if not first_sight and xid != gpu.last_xid and xid != 0:
            # The field only holds the newest code: a change is the one event we can see.
            gpu.xids.record(xid, log, gpu.index, gpu.uuid, note=" (from dcgm-exporter)")
        gpu.last_xid = xid
        # Code 0 is the field's "no XID yet": not a code to show as the newest.
        out.extend(
            gpu.xids.samples(
                now, lambda **extra: {"gpu": gpu.index, **extra}, xid if xid != 0 else None
            )
        )
