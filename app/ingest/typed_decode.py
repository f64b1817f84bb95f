"""One-pass decode of an ingest body into typed structs (msgspec): the validator's fast path.

``app.ingest.validation`` owns the rules and their messages. ``TypedDecoder.decode`` parses the
JSON and, in the same pass and in C, checks every rule that depends neither on the clock nor on
the series seen before: the types (strict: no bool for a number, no float for an int), the
numeric bounds, the identifier patterns and lengths, the limits on list and map sizes, no
unknown field. It raises on anything else (one of ``DECODE_FAILED``), and the validator then runs
its exact checks on the body to produce the documented message: msgspec's own error text is
never shown to a client.

A sample's ``labels`` stay raw JSON text (``msgspec.Raw``): they are checked once per series,
not once per sample (the validator caches the series of each (name, labels text) pair that
passed its checks, and parses the text with orjson when it first sees it, which also checks its
UTF-8 and structure: msgspec does not look inside a Raw value).

Every pattern here ends in ``\\Z``, not ``$``: msgspec matches with Python's ``re``, where
``$`` also matches before a final newline, while the documented rules (pydantic's) refuse
``"node-1\\n"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Protocol, cast

import msgspec
from msgspec import Meta, Raw

from app.core.config import IngestLimits
from recovery.protocol.samples import Batch, ParticipantReport, Sample, in_wire_order

# The character classes of the patterns in validation.py, anchored at the very end.
_ID = r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]*\Z"
_PHASE = r"^[A-Za-z_][A-Za-z0-9_]*\Z"
_TEXT = r"^[^\x00]*\Z"

# What a refused body raises. UnicodeDecodeError: msgspec checks the UTF-8 of the strings it
# decodes and raises Python's own error for a bad byte.
DECODE_FAILED = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError)

NO_LABELS = b""  # the raw text of a sample sent without "labels"


class TypedSample(Protocol):
    name: str
    value: float
    ts: float
    labels: Raw


class TypedBatch(Protocol):
    agent_id: str
    node: str
    seq: int
    sent_at: float
    samples: list[TypedSample]
    participants: list[msgspec.Struct]  # ParticipantReport's fields, in its order
    fingerprint: dict[str, str] | None


@dataclass(frozen=True, slots=True)
class DecodeBounds:
    """The numeric bounds of a batch (``app.ingest.validation`` owns the values and why)."""

    min_timestamp: float
    max_timestamp: float
    max_abs_value: float
    max_seq: int
    max_step: int
    max_rank: int


def _struct_types(limits: IngestLimits, bounds: DecodeBounds) -> type[Any]:
    """The batch struct type for these limits and bounds (the constraints are part of the
    type)."""
    # Built with defstruct: the constraints come from the limits, so the types are made at run
    # time. Not gc-tracked: the structs hold only scalars, strings and Raw values (never a
    # cycle), and a batch creates thousands of them.
    timestamp = Annotated[float, Meta(ge=bounds.min_timestamp, le=bounds.max_timestamp)]
    ident = Annotated[str, Meta(pattern=_ID, min_length=1, max_length=limits.max_id_length)]
    fp_key = Annotated[str, Meta(pattern=_TEXT, min_length=1, max_length=128)]
    fp_value = Annotated[str, Meta(pattern=_TEXT, max_length=limits.max_fingerprint_value_length)]
    options: dict[str, Any] = {"forbid_unknown_fields": True, "gc": False}
    sample = msgspec.defstruct(
        "Sample",
        in_wire_order(
            Sample,
            {
                "name": str,
                "value": Annotated[float, Meta(ge=-bounds.max_abs_value, le=bounds.max_abs_value)],
                "ts": timestamp,
                "labels": Raw,
            },
            {"labels": Raw(NO_LABELS)},
        ),
        **options,
    )
    participant = msgspec.defstruct(
        "Participant",
        in_wire_order(
            ParticipantReport,
            {
                "job": ident,
                "role": Annotated[str, Meta(pattern=_ID, min_length=1, max_length=64)],
                "rank": Annotated[int, Meta(ge=0, le=bounds.max_rank)],
                "phase": Annotated[str, Meta(pattern=_PHASE, min_length=1, max_length=64)],
                "step": Annotated[int, Meta(ge=0, le=bounds.max_step)],
                "ts": timestamp,
            },
        ),
        **options,
    )
    fingerprint = Annotated[dict[fp_key, fp_value], Meta(max_length=limits.max_fingerprint_keys)]
    return msgspec.defstruct(
        "Batch",
        in_wire_order(
            Batch,
            {
                "agent_id": ident,
                "node": ident,
                "seq": Annotated[int, Meta(ge=0, le=bounds.max_seq)],
                "sent_at": timestamp,
                "samples": Annotated[list[sample], Meta(max_length=limits.max_samples)],  # type: ignore[valid-type]
                "participants": Annotated[
                    list[participant],  # type: ignore[valid-type]
                    Meta(max_length=limits.max_participants),
                ],
                "fingerprint": fingerprint | None,
            },
            {"participants": [], "fingerprint": None},
        ),
        **options,
    )


class TypedDecoder:
    """Decodes ingest bodies under ``limits`` and ``bounds`` (validation.py's)."""

    def __init__(self, limits: IngestLimits, bounds: DecodeBounds) -> None:
        batch = _struct_types(limits, bounds)
        self._decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(batch)

    def decode(self, body: bytes) -> TypedBatch:
        """The typed batch; raises one of ``DECODE_FAILED`` for anything it does not accept."""
        return cast(TypedBatch, self._decoder.decode(body))
