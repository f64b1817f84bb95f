"""Scraping a Prometheus text exposition (``/metrics``) for the few series a collector maps.

Used by the dcgm-exporter and inference-engine collectors. Series are parsed with
``prometheus_client.parser`` (the reference parser), but only those of the families the caller
names: an inference engine's page is mostly histogram buckets the agent never reads, and
parsing them every second would cost more CPU than the rest of a round. See
:class:`ExpositionReader` for why a known series is not parsed again.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


class ScrapeError(Exception):
    """The endpoint did not answer with a parsable exposition; the message says why."""


@dataclass(frozen=True, slots=True)
class ExpositionSample:
    """One sample line: its name as the parser gives it (a counter's always ends in ``_total``,
    even where the page wrote it without, as dcgm-exporter does), labels and value."""

    name: str
    labels: dict[str, str]
    value: float


class ExpositionReader:
    """Reads the wanted families of one endpoint's page, scrape after scrape.

    The first time a series (its name and labels) appears, its line is parsed by
    ``prometheus_client.parser`` together with its family's ``# TYPE`` line, and the result is
    kept: a page repeats the same series every scrape and only the values change, so later
    scrapes read just the value (``float``) of a known series. Label parsing was most of the
    agent's CPU on a dcgm-exporter page (8 GPUs × 30 fields, every second). A value that is not a
    number makes the page malformed, as an unparsable new series does.
    """

    _MAX_SERIES = 50_000  # a page whose series keep changing must not grow the cache forever

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes
        self._series: dict[str, tuple[str, dict[str, str]]] = {}

    def parse(self, text: str) -> list[ExpositionSample]:
        """The samples of the wanted families (labels dicts are shared: do not change them)."""
        out: list[ExpositionSample] = []
        type_line = ""
        for line in text.splitlines():
            if line.startswith("#"):
                if line.startswith("# TYPE ") and line[7:].startswith(self.prefixes):
                    type_line = line
                continue
            if not line.startswith(self.prefixes):
                continue
            brace = line.rfind("}")
            series, _, rest = (
                (line[: brace + 1], "", line[brace + 1 :]) if brace >= 0 else line.partition(" ")
            )
            known = self._series.get(series)
            if known is None:
                known = self._learn(series, type_line)
            try:
                value = float(rest.split()[0])
            except (ValueError, IndexError):
                raise ScrapeError(
                    f"not a Prometheus text exposition: bad value in {line!r}"
                ) from None
            if math.isfinite(value):
                out.append(ExpositionSample(known[0], known[1], value))
        return out

    def _learn(self, series: str, type_line: str) -> tuple[str, dict[str, str]]:
        family = type_line.split()[2] if type_line else ""
        header = type_line + "\n" if family and series.startswith(family) else ""
        try:
            samples = [
                s
                for f in text_string_to_metric_families(f"{header}{series} 0\n")
                for s in f.samples
            ]
        except ValueError as exc:
            raise ScrapeError(f"not a Prometheus text exposition: {exc}") from None
        if len(samples) != 1:
            raise ScrapeError(f"not a Prometheus text exposition: {series!r}")
        if len(self._series) >= self._MAX_SERIES:
            self._series.clear()
        known = self._series[series] = (samples[0].name, dict(samples[0].labels))
        return known


def scrape(client: httpx.Client, url: str, reader: ExpositionReader) -> list[ExpositionSample]:
    """GET ``url`` and read it; raises :class:`ScrapeError` for any failure (the message is
    one line fit for a log: refused, timed out, HTTP status, or malformed text)."""
    try:
        response = client.get(url)
    except httpx.TimeoutException:
        raise ScrapeError(f"{url}: no answer within {client.timeout.read} s") from None
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ScrapeError(f"{url}: HTTP {response.status_code}")
    return reader.parse(response.text)


def by_name(samples: Iterable[ExpositionSample]) -> dict[str, list[ExpositionSample]]:
    """Group samples by their full name."""
    out: dict[str, list[ExpositionSample]] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out
