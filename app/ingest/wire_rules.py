"""The rules of an ingest body that do not change at run time: identifier and name patterns,
numeric bounds, and the pydantic description of the whole body (the exact path's envelope in
``app.ingest.validation`` and the OpenAPI schema of ``POST /api/v1/ingest``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from app.core.config import IngestLimits
from app.ingest.typed_decode import DecodeBounds
from recovery.protocol.samples import Batch, ParticipantReport, Sample, in_wire_order

METRIC_NAME_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
LABEL_NAME_PATTERN = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
# Node, agent, job and role identifiers: printable, no spaces, no path tricks at the start.
ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:@/-]*$"
PHASE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Free text (label values, fingerprint keys and values): anything but NUL, which PostgreSQL's
# text and JSON cannot hold.
TEXT_PATTERN = r"^[^\x00]*$"

# Timestamps (Unix seconds): from 1970 to the last second ``datetime`` holds (9999-12-31
# 23:59:59 UTC; PostgreSQL's timestamp reaches further), and never more than
# ``max_future_skew_seconds`` ahead of the server clock.
MIN_TIMESTAMP = 0.0
MAX_TIMESTAMP = 253_402_300_799.0
# Sample values: a minute's rollup sums its samples, and a sum of up to 10^8 values of this size
# is still a finite double (an infinite or NaN aggregate is refused by SQLite's NOT NULL REAL).
MAX_ABS_VALUE = 1e300
MAX_SEQ = 2**62  # below the bigint column's 2^63 - 1, with room for the window arithmetic
MAX_STEP = 2**31 - 1  # the column is INTEGER (32-bit) on PostgreSQL
MAX_RANK = 1_000_000
# In DecodeBounds' field order (each constant is named after its field).
DECODE_BOUNDS = DecodeBounds(
    MIN_TIMESTAMP, MAX_TIMESTAMP, MAX_ABS_VALUE, MAX_SEQ, MAX_STEP, MAX_RANK
)


def build_models(limits: IngestLimits) -> tuple[type[BaseModel], type[BaseModel]]:
    """(envelope model, full documentation model) for these limits."""
    Timestamp = Annotated[  # noqa: N806
        float, Field(allow_inf_nan=False, ge=MIN_TIMESTAMP, le=MAX_TIMESTAMP)
    ]
    Value = Annotated[  # noqa: N806
        float, Field(allow_inf_nan=False, ge=-MAX_ABS_VALUE, le=MAX_ABS_VALUE)
    ]
    Ident = Annotated[  # noqa: N806
        str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=limits.max_id_length)
    ]
    Phase = Annotated[  # noqa: N806
        str, StringConstraints(pattern=PHASE_PATTERN, min_length=1, max_length=64)
    ]
    FpKey = Annotated[  # noqa: N806
        str, StringConstraints(pattern=TEXT_PATTERN, min_length=1, max_length=128)
    ]
    FpValue = Annotated[  # noqa: N806
        str,
        StringConstraints(pattern=TEXT_PATTERN, max_length=limits.max_fingerprint_value_length),
    ]
    Fingerprint = Annotated[  # noqa: N806
        dict[FpKey, FpValue], Field(max_length=limits.max_fingerprint_keys)
    ]
    MetricName = Annotated[  # noqa: N806
        str, StringConstraints(pattern=METRIC_NAME_PATTERN, max_length=limits.max_name_length)
    ]
    LabelName = Annotated[  # noqa: N806
        str,
        StringConstraints(pattern=LABEL_NAME_PATTERN, max_length=limits.max_label_name_length),
    ]
    LabelValue = Annotated[  # noqa: N806
        str, StringConstraints(pattern=TEXT_PATTERN, max_length=limits.max_label_value_length)
    ]
    Labels = Annotated[dict[LabelName, LabelValue], Field(max_length=limits.max_labels)]  # noqa: N806
    strict = ConfigDict(strict=True, extra="forbid")
    participant = _model(
        "Participant",
        strict,
        ParticipantReport,
        {
            "job": Ident,
            "role": Annotated[
                str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=64)
            ],
            "rank": Annotated[int, Field(ge=0, le=MAX_RANK)],
            "phase": Phase,
            "step": Annotated[int, Field(ge=0, le=MAX_STEP)],
            "ts": Timestamp,
        },
    )
    sample = _model(
        "Sample",
        strict,
        Sample,
        {"name": MetricName, "value": Value, "ts": Timestamp, "labels": Labels},
        {"labels": {}},
    )
    batch = {
        "agent_id": Ident,
        "node": Ident,
        "seq": Annotated[int, Field(ge=0, le=MAX_SEQ)],
        "sent_at": Timestamp,
        "samples": Annotated[list[sample], Field(max_length=limits.max_samples)],  # type: ignore[valid-type]
        "participants": Annotated[list[participant], Field(max_length=limits.max_participants)],  # type: ignore[valid-type]
        "fingerprint": Fingerprint | None,
    }
    defaults: dict[str, Any] = {"participants": [], "fingerprint": None}
    doc = _model("IngestBatchDoc", strict, Batch, batch, defaults)
    # The exact path checks the samples in its own loop (hot path), not with pydantic: its
    # envelope is the same body without them.
    envelope_fields = {
        name: (spec, defaults.get(name, ...)) for name, spec in batch.items() if name != "samples"
    }
    envelope = create_model("IngestEnvelope", __config__=strict, **envelope_fields)  # type: ignore[call-overload]
    return envelope, doc


def _model(
    name: str,
    config: ConfigDict,
    shape: type,
    spec: dict[str, Any],
    defaults: dict[str, Any] | None = None,
) -> type[BaseModel]:
    """A pydantic model of a wire shape, its fields in the wire's order."""
    fields = {
        f[0]: (f[1], f[2] if len(f) == 3 else ...) for f in in_wire_order(shape, spec, defaults)
    }
    return create_model(name, __config__=config, **fields)  # type: ignore[call-overload, no-any-return]
