"""What the agent's two GPU sources (NVML, dcgm-exporter) have in common: the interface the
agent drives, the clock-event (throttle) flags they derive from the same bitmask, and the XID
tally they keep per GPU. Kept in one place so that the two sources cannot drift apart in what a
dashboard or a detector sees (``docs/metrics.md`` documents one set of names for both)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sized
from dataclasses import dataclass, field

import pynvml

from recovery.protocol.metric_names import CRITICAL_XIDS
from recovery.protocol.samples import Sample, make_sample

# The clock-event (formerly throttle) reason bits: NVML's constants, the same bits in DCGM's field.
_THERMAL = (
    pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    | pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
)
_POWER = (
    pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
)
_HW_SLOWDOWN = pynvml.nvmlClocksThrottleReasonHwSlowdown


class GpuSource(ABC):
    """A source of GPU samples, one round per :meth:`collect`.

    A subclass keeps ``_available``, ``_unavailable_reason`` (why the source does not answer,
    None while it does) and ``_gpus`` (one entry per GPU it has listed) up to date.
    """

    _available: bool
    _unavailable_reason: str | None
    _gpus: Sized

    @property
    def available(self) -> bool:
        """True while the source answers (NVML initialised, the last scrape succeeded)."""
        return self._available

    @property
    def unavailable_reason(self) -> str | None:
        """Why the source does not answer (its error text), or None."""
        return self._unavailable_reason

    @property
    def gpu_count(self) -> int:
        """GPUs the source has listed (NVML: at initialisation; the exporter: since the agent
        started, lost ones included)."""
        return len(self._gpus)

    @abstractmethod
    def start(self) -> bool:
        """Prepare the source; False (logged once) when it is not there."""

    @abstractmethod
    def close(self) -> None:
        """Release what the source holds; errors are logged, not raised."""

    @abstractmethod
    def driver_versions(self) -> dict[str, str]:
        """The driver versions the source can tell (empty when it tells none)."""

    @abstractmethod
    def collect(self) -> list[Sample]:
        """This round's GPU samples (none while the source is down)."""


def throttle_flags(bits: int) -> list[tuple[str, int]]:
    """The samples (name, value) one clock-event reasons bitmask gives: the mask itself and
    whether a thermal, a power or a hardware slowdown is active."""
    return [
        ("gpu_throttle_reasons_bitmask", bits),
        ("gpu_throttle_thermal_active", 1 if bits & _THERMAL else 0),
        ("gpu_throttle_power_active", 1 if bits & _POWER else 0),
        ("gpu_throttle_hw_slowdown_active", 1 if bits & _HW_SLOWDOWN else 0),
    ]


@dataclass
class XidTally:
    """The XID events seen on one GPU: how many of each code, how many of them critical."""

    counts: dict[int, int] = field(default_factory=dict)
    critical: int = 0

    def record(
        self, xid: int, log: logging.Logger, gpu: object, uuid: str, *, note: str = ""
    ) -> None:
        """Count one XID ``xid`` of GPU ``gpu`` and log it (an error when it is critical);
        ``note`` ends the log line (where the event was seen)."""
        self.counts[xid] = self.counts.get(xid, 0) + 1
        critical = xid in CRITICAL_XIDS
        if critical:
            self.critical += 1
        log.log(
            logging.ERROR if critical else logging.WARNING,
            "gpu %s (%s): XID %d%s" + note,
            gpu,
            uuid,
            xid,
            " (critical)" if critical else "",
        )

    def samples(
        self, now: float, labels: Callable[..., dict[str, str]], last_code: int | None
    ) -> list[Sample]:
        """The tally as samples; ``labels(**extra)`` gives a sample's labels, ``last_code`` (if
        not None) is sent as the GPU's newest XID code."""
        out = [make_sample("gpu_xid_critical_events_total", self.critical, now, labels())]
        for code, count in self.counts.items():
            out.append(make_sample("gpu_xid_events_total", count, now, labels(xid=str(code))))
        if last_code is not None:
            out.append(make_sample("gpu_xid_last_code", last_code, now, labels()))
        return out
