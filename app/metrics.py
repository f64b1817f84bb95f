"""Everything ``/metrics`` exports: the server's own metrics and the agents' latest values.

* The server's own counters and histograms (``app.core.server_metrics.ServerMetrics``), on the
  registry ``build_registry`` returns.
* ``SeriesCollector``: a custom Collector that, at scrape time, turns the latest point of every
  series in the ``SeriesStore`` into ``rlguard_<name>{node, gpu, job, role}``.

Label policy for the agents' series: only ``node`` plus the labels in
``settings.series.export_labels`` (default gpu, job, role) are exported. Everything else (rank,
pid, step, run id, ...) is dropped because each distinct value would be a new Prometheus series
forever. Rank is left out on purpose: per-rank detail is in the REST API and the policy engine;
in Prometheus a job's roles are what dashboards group by. Series that become identical once those
labels are dropped are collapsed into one sample: the newest (ties: the larger value), and the
number collapsed is exported as ``rlguard_export_collapsed_series``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.core.server_metrics import ServerMetrics
from app.series.store import SeriesStore

PREFIX = "rlguard_"


def exported_name(name: str) -> str:
    return name if name.startswith(PREFIX) else PREFIX + name


class SeriesCollector(Collector):
    """Latest value of every series in ``store``, computed at scrape time."""

    def __init__(
        self,
        store: SeriesStore,
        export_labels: Iterable[str],
        *,
        reserved_names: Iterable[str] = (),
    ) -> None:
        self.store = store
        # Names the server's own metrics use: an agent series may not shadow them.
        self.reserved = frozenset(reserved_names)
        self.export_labels = tuple(dict.fromkeys(lb for lb in export_labels if lb != "node"))
        self.label_names = ("node", *self.export_labels)

    def _is_reserved(self, name: str) -> bool:
        # A family "x" owns x, x_total, x_bucket, x_count, x_sum, x_created ...
        return any(name == r or name.startswith(r + "_") for r in self.reserved)

    def collect(self) -> Iterator[Metric]:
        # name -> label values -> (ts, value); collisions keep the newest point.
        by_name: dict[str, dict[tuple[str, ...], tuple[float, float]]] = {}
        collapsed = skipped = 0
        for key, point in self.store.items():
            name = exported_name(key.name)
            if self._is_reserved(name):
                skipped += 1
                continue
            labels = dict(key.labels)
            values = (key.node, *(labels.get(lb, "") for lb in self.export_labels))
            family = by_name.setdefault(name, {})
            prev = family.get(values)
            if prev is not None:
                collapsed += 1
                if (prev[0], prev[1]) >= (point.ts, point.value):
                    continue
            family[values] = (point.ts, point.value)
        for name in sorted(by_name):
            samples = by_name[name]
            metric: CounterMetricFamily | GaugeMetricFamily
            if name.endswith("_total"):
                metric = CounterMetricFamily(
                    name[: -len("_total")], "Agent-reported counter", labels=self.label_names
                )
            else:
                metric = GaugeMetricFamily(name, "Agent-reported value", labels=self.label_names)
            for values, (_ts, value) in samples.items():
                metric.add_metric(list(values), value)
            yield metric
        yield GaugeMetricFamily(
            "rlguard_export_collapsed_series",
            "Series merged into another at export because their dropped labels differed",
            value=collapsed,
        )
        yield GaugeMetricFamily(
            "rlguard_export_skipped_series",
            "Agent series not exported because their name is one of the server's own metrics",
            value=skipped,
        )
        yield GaugeMetricFamily(
            "rlguard_series_exported", "Series in the in-memory window", value=len(self.store)
        )


Row = TypeVar("Row")


class _RefreshedRows(Generic[Row]):
    """Rows computed from the database at most once per ``refresh_seconds`` (scrapes in between
    reuse them). A failing computation keeps the last good rows (and is logged on ``logger``):
    the exporter must not fail the whole scrape for one subsystem."""

    def __init__(
        self,
        compute: Callable[[], list[Row]],
        *,
        refresh_seconds: float,
        clock: Callable[[], float],
        logger: str,
    ) -> None:
        self._compute = compute
        self._refresh = refresh_seconds
        self._clock = clock
        self._log = logging.getLogger(logger)
        self._lock = threading.Lock()
        self._at: float | None = None
        self._rows: list[Row] = []

    def current(self) -> list[Row]:
        with self._lock:
            now = self._clock()
            if self._at is None or now - self._at >= self._refresh:
                try:
                    self._rows = self._compute()
                except Exception:  # noqa: BLE001 - logged; the last rows stay exported
                    self._log.exception("metrics computation failed")
                self._at = now
            return self._rows


class GoodputCollector(Collector):
    """Per job: ``rlguard_job_ettr_ratio`` (the last 24 h) and
    ``rlguard_job_gpu_hours_lost_total`` (its life), from the goodput ledger.

    The figures come from the database (``app.goodput.queries.metrics_snapshot``), so a scrape
    reuses the last computation for ``refresh_seconds``: a scrape every 15 s costs at most one
    ledger pass per job per refresh.
    """

    def __init__(
        self,
        compute: Callable[[], list[tuple[str, float, float]]],
        *,
        refresh_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rows = _RefreshedRows(
            compute, refresh_seconds=refresh_seconds, clock=clock, logger="rlguard.goodput"
        )

    def _current(self) -> list[tuple[str, float, float]]:
        return self._rows.current()

    def collect(self) -> Iterator[Metric]:
        rows = self._current()
        ettr = GaugeMetricFamily(
            PREFIX + "job_ettr_ratio",
            "Effective training time ratio of the job over the last 24 h (productive / wall "
            "time; 1.0 without faults), from the goodput ledger",
            labels=["job"],
        )
        lost = CounterMetricFamily(
            PREFIX + "job_gpu_hours_lost",
            "GPU-hours the job lost to faults (detection, approval, recovery, redone work) over "
            "its recorded life, from the goodput ledger",
            labels=["job"],
        )
        for job, ratio, hours in rows:
            ettr.add_metric([job], ratio)
            lost.add_metric([job], hours)
        yield ettr
        yield lost


class IncidentCollector(Collector):
    """``rlguard_incidents_open{kind, tier}``: open incidents from the database (every server
    replica exports the same figures: aggregate with max, not sum). Only kinds and tiers with an
    open incident have a sample; both label sets are closed (fault kinds, three tiers)."""

    def __init__(
        self,
        compute: Callable[[], list[tuple[str, str, int]]],
        *,
        refresh_seconds: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rows = _RefreshedRows(
            compute, refresh_seconds=refresh_seconds, clock=clock, logger="rlguard.incidents"
        )

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            PREFIX + "incidents_open",
            "Open incidents by fault kind and tier (a train_hang incident is a hung trainer)",
            labels=["kind", "tier"],
        )
        for kind, tier, count in self._rows.current():
            family.add_metric([kind, tier], count)
        yield family


def build_registry(
    store: SeriesStore, export_labels: Iterable[str]
) -> tuple[CollectorRegistry, ServerMetrics]:
    """A fresh registry with the server metrics and the series collector on it."""
    registry = CollectorRegistry(auto_describe=False)
    metrics = ServerMetrics(registry)
    reserved = {
        "rlguard_export_collapsed_series",
        "rlguard_export_skipped_series",
        "rlguard_series_exported",
    }
    reserved.update(family.name for family in registry.collect())
    registry.register(SeriesCollector(store, export_labels, reserved_names=reserved))
    return registry, metrics
