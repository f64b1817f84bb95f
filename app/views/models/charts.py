"""Chart specifications for the dashboard's uPlot charts (``app/static/js/charts.js``).

A spec is plain JSON: one shared x axis (unix seconds) and one value list per series, aligned to
it with ``None`` where a series has no sample. Series are bucketed to a fixed step so that GPUs
sampled a few milliseconds apart share x values, and long windows stay small in the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from markupsafe import Markup

Level = str  # "ok" | "warn" | "bad"


@dataclass(frozen=True, slots=True)
class Band:
    """A horizontal band behind the data; ``None`` bounds are open ends."""

    low: float | None
    high: float | None
    level: Level

    def to_json(self) -> dict[str, Any]:
        return {"from": self.low, "to": self.high, "level": self.level}


@dataclass(frozen=True, slots=True)
class Threshold:
    value: float
    label: str
    level: Level = "warn"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "label": self.label, "level": self.level}


@dataclass(slots=True)
class ChartSpec:
    title: str
    unit: str = ""
    x: list[float] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    thresholds: list[Threshold] = field(default_factory=list)
    window: tuple[float, float] | None = None
    y_min: float | None = None
    y_max: float | None = None
    latest: float | None = None
    digits: int = 0  # decimals of the latest value shown beside the title

    @property
    def empty(self) -> bool:
        return not self.x

    def to_json(self) -> dict[str, Any]:
        return {
            "x": self.x,
            "series": self.series,
            "unit": self.unit,
            "bands": [b.to_json() for b in self.bands],
            "thresholds": [t.to_json() for t in self.thresholds],
            "window": list(self.window) if self.window else None,
            "y": {"min": self.y_min, "max": self.y_max},
        }

    def json_markup(self) -> Markup:
        """The spec as compact JSON, safe in a single-quoted HTML attribute.

        Built here rather than with Jinja's ``tojson`` because the overview embeds hundreds of
        sparklines: compact separators and no empty keys keep the page and the render small.
        """
        data: dict[str, Any] = {"x": self.x, "series": self.series}
        if self.unit:
            data["unit"] = self.unit
        if self.bands:
            data["bands"] = [b.to_json() for b in self.bands]
        if self.thresholds:
            data["thresholds"] = [t.to_json() for t in self.thresholds]
        if self.window:
            data["window"] = list(self.window)
        if self.y_min is not None or self.y_max is not None:
            data["y"] = {"min": self.y_min, "max": self.y_max}
        return safe_json(data)


def safe_json(data: Any) -> Markup:
    """Compact JSON that is safe in a single-quoted HTML attribute (and in a script element): the
    escaping of Jinja's ``tojson``, so no quote, ``&`` or ``<`` in a label can break out."""
    # orjson: the overview's sparkline document is ~100 KB per render; the stdlib encoder was a
    # few ms of it. (It also writes NaN/inf as null, which JSON.parse accepts.)
    text = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS).decode()
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(raw, escaped)
    return Markup(text)


def _round(value: float) -> float:
    # Four significant decimals are plenty on a 200-pixel chart and keep the page small.
    return round(value, 4)


def aligned_chart(
    title: str,
    named_points: Mapping[str, Iterable[tuple[float, float]]],
    *,
    step_seconds: float,
    unit: str = "",
    scale: float = 1.0,
    colors: Mapping[str, str] | None = None,
) -> ChartSpec:
    """One chart of several series, bucketed to ``step_seconds`` (the last value in a bucket wins)."""
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds!r}")
    per_series: dict[str, dict[float, float]] = {}
    buckets: set[float] = set()
    for label, points in named_points.items():
        values: dict[float, float] = {}
        for ts, value in points:
            bucket = (ts // step_seconds) * step_seconds
            values[bucket] = value * scale
        per_series[label] = values
        buckets.update(values)
    x = sorted(buckets)
    spec = ChartSpec(title=title, unit=unit, x=x)
    latest: float | None = None
    for label, values in per_series.items():
        column = [_round(values[b]) if b in values else None for b in x]
        entry: dict[str, Any] = {"label": label, "values": column}
        if colors and label in colors:
            entry["color"] = colors[label]
        spec.series.append(entry)
        if values:
            last = values[max(values)]
            latest = last if latest is None else max(latest, last)
    spec.latest = latest
    return spec


def sparkline(points: Sequence[tuple[float, float]], *, unit: str = "") -> ChartSpec:
    """A one-series chart from points already at the resolution wanted (no bucketing)."""
    # Whole seconds and one decimal are all a 100-pixel line can show.
    spec = ChartSpec(title="", unit=unit, x=[int(p[0]) for p in points])
    spec.series.append({"label": "", "values": [round(p[1], 1) for p in points]})
    spec.latest = points[-1][1] if points else None
    return spec


def golden_bands(healthy: float, warning: float, *, higher_is_worse: bool = True) -> list[Band]:
    """Green below the healthy bound, amber between, red beyond the warning bound."""
    if not higher_is_worse:
        return [
            Band(healthy, None, "ok"),
            Band(warning, healthy, "warn"),
            Band(None, warning, "bad"),
        ]
    return [Band(None, healthy, "ok"), Band(healthy, warning, "warn"), Band(warning, None, "bad")]
