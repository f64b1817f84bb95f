"""The sample shape of the ingest contract: ``{"name", "value", "ts", "labels"}``.

Samples are plain dicts (not objects) because they go straight into the JSON body and the spool;
building a dataclass and converting it back per sample would cost the agent CPU for nothing.
"""

from __future__ import annotations

from typing import TypedDict


class Sample(TypedDict):
    """One metric value at one time, with its labels (all strings)."""

    name: str
    value: float
    ts: float
    labels: dict[str, str]


class Participant(TypedDict):
    """A training participant's identity and phase, as the ingest body's ``participants``."""

    job: str
    role: str
    rank: int
    phase: str
    step: int
    ts: float


def make_sample(name: str, value: float, ts: float, labels: dict[str, str]) -> Sample:
    """Build a sample; ``value`` is converted to float so the JSON body carries a number."""
    return {"name": name, "value": float(value), "ts": ts, "labels": labels}
