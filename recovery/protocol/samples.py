"""The ingest batch on the wire (``POST /api/v1/ingest``): what a node agent sends and what the
server validates, declared once.

A batch is one JSON object (``Batch``): the agent's identity and sequence number, its samples
(``Sample``: one metric value at one time, with string labels) and the training participants it
saw (``ParticipantReport``: identity, phase, step). The agent builds samples as plain dicts
(thousands a round go straight into the JSON body and the spool; an object per sample would cost
CPU for nothing) and participants as ``ParticipantReport`` (orjson writes a dataclass as the
same JSON object). The server keeps its limits and patterns beside its validators
(``app.ingest.wire_rules``) and builds its decoders from these shapes in their order with
``in_wire_order``, so a field renamed or added here fails at the server's import, not in
production.
"""

# No ``from __future__ import annotations``: Python 3.11's TypedDict reads ``NotRequired`` only
# from evaluated annotations (``__optional_keys__``), and the decoders take their defaults there.
import dataclasses
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict, TypeVar

T = TypeVar("T")

__all__ = [
    "Batch",
    "ParticipantReport",
    "Sample",
    "in_wire_order",
    "make_sample",
    "optional_fields",
    "wire_fields",
]


class Sample(TypedDict):
    """One metric value at one time; ``labels`` (all strings) may be left out: none."""

    name: str
    value: float
    ts: float
    labels: NotRequired[dict[str, str]]


@dataclasses.dataclass(slots=True)
class ParticipantReport:
    """A training participant's identity and phase at ``ts``, as its node reports it."""

    job: str
    role: str
    rank: int
    phase: str
    step: int
    ts: float


class Batch(TypedDict):
    """The whole body. ``seq`` and ``sent_at`` are stamped by the agent's sender as it posts
    (the spool keeps a body without them); ``participants`` and ``fingerprint`` may be left
    out."""

    agent_id: str
    node: str
    seq: int
    sent_at: float
    samples: list[Sample]
    participants: NotRequired[list[ParticipantReport]]
    fingerprint: NotRequired[dict[str, str] | None]


def make_sample(name: str, value: float, ts: float, labels: dict[str, str]) -> Sample:
    """Build a sample; ``value`` is converted to float so the JSON body carries a number."""
    return {"name": name, "value": float(value), "ts": ts, "labels": labels}


def wire_fields(shape: type) -> tuple[str, ...]:
    """The field names of ``shape`` (``Sample``, ``ParticipantReport``, ``Batch``) in order."""
    if dataclasses.is_dataclass(shape):
        return tuple(f.name for f in dataclasses.fields(shape))
    return tuple(shape.__annotations__)


def optional_fields(shape: type) -> frozenset[str]:
    """The fields a sender may leave out."""
    if dataclasses.is_dataclass(shape):
        return frozenset()
    return frozenset(getattr(shape, "__optional_keys__", frozenset()))


def in_wire_order(
    shape: type, spec: Mapping[str, T], defaults: Mapping[str, Any] | None = None
) -> list[tuple[str, T] | tuple[str, T, Any]]:
    """``spec`` (a decoder's type for each field) as ``(name, type)`` in the wire's order, with
    ``(name, type, default)`` for an optional field. Raises ``ValueError`` naming the fields if
    ``spec`` does not name exactly the shape's fields, or ``defaults`` exactly its optional
    ones: a decoder that drifted from the contract fails where it is built."""
    defaults = defaults or {}
    names = wire_fields(shape)
    if set(spec) != set(names) or set(defaults) != optional_fields(shape):
        raise ValueError(
            f"a decoder of {shape.__name__} must name the fields {list(names)}"
            f" (got {sorted(spec)}) with defaults for {sorted(optional_fields(shape))}"
            f" (got {sorted(defaults)})"
        )
    return [(n, spec[n], defaults[n]) if n in defaults else (n, spec[n]) for n in names]
