"""The text forms people type, in the CLI and the dashboard's form: matcher lists and
durations. Both end in the same ``InvalidInput`` that names the bad value."""

from __future__ import annotations

import re

from app.core.errors import InvalidInput
from app.silences.matchers import Matcher
from app.silences.public import MatcherIn

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([mhdw])")
_MINUTES = {"m": 1, "h": 60, "d": 24 * 60, "w": 7 * 24 * 60}


def parse_duration_minutes(text: str, *, name: str = "duration") -> float:
    """``90m``, ``2h``, ``1.5d``, ``1w`` in minutes."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise InvalidInput(
            f"{name} {text!r}: expected a number and a unit m, h, d or w (e.g. 90m, 2h)"
        )
    return float(m.group(1)) * _MINUTES[m.group(2)]


def matchers_from_text(items: list[str]) -> list[MatcherIn]:
    """``["node=n1", "kind=~gpu_.*"]`` (the dashboard splits its field on commas and lines);
    blank items are skipped, so an empty list is caught by the store as "no matcher"."""
    parsed = [Matcher.parse_text(item) for item in items if item.strip()]
    return [MatcherIn(label=m.label, op=m.op, value=m.value) for m in parsed]
