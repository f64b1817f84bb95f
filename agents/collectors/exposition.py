"""Scraping a Prometheus text exposition (``/metrics``) for the few series a collector maps.

Used by the dcgm-exporter and inference-engine collectors. The text is parsed with
``prometheus_client.parser`` (the reference parser), but only after the lines of families the
caller does not want are dropped: an inference engine's page is mostly histogram buckets the
agent never reads, and parsing them every second would cost more CPU than the rest of a round.
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


def keep_lines(text: str, prefixes: tuple[str, ...]) -> str:
    """The lines of ``text`` (samples and their ``# HELP``/``# TYPE``) whose metric name starts
    with one of ``prefixes``; everything else is dropped before parsing."""
    kept: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(prefixes):
                kept.append(line)
        elif line.startswith(prefixes):
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_samples(text: str, prefixes: tuple[str, ...]) -> list[ExpositionSample]:
    """Parse the wanted part of an exposition; raises :class:`ScrapeError` on malformed text."""
    out: list[ExpositionSample] = []
    try:
        for family in text_string_to_metric_families(keep_lines(text, prefixes)):
            for s in family.samples:
                if math.isfinite(s.value):
                    out.append(ExpositionSample(s.name, dict(s.labels), float(s.value)))
    except ValueError as exc:
        raise ScrapeError(f"not a Prometheus text exposition: {exc}") from None
    return out


def scrape(client: httpx.Client, url: str, prefixes: tuple[str, ...]) -> list[ExpositionSample]:
    """GET ``url`` and parse it; raises :class:`ScrapeError` for any failure (the message is
    one line fit for a log: refused, timed out, HTTP status, or malformed text)."""
    try:
        response = client.get(url)
    except httpx.TimeoutException:
        raise ScrapeError(f"{url}: no answer within {client.timeout.read} s") from None
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ScrapeError(f"{url}: HTTP {response.status_code}")
    return parse_samples(response.text, prefixes)


def by_name(samples: Iterable[ExpositionSample]) -> dict[str, list[ExpositionSample]]:
    """Group samples by their full name."""
    out: dict[str, list[ExpositionSample]] = {}
    for s in samples:
        out.setdefault(s.name, []).append(s)
    return out
