"""The ingest batch is one contract: the agent builds it from ``recovery.protocol.samples`` and
the server's three decoders (the msgspec fast path, the exact path's pydantic envelope, the
OpenAPI model) are built from the same shapes. A field renamed on one side fails here."""

from __future__ import annotations

from dataclasses import asdict

import orjson
import pytest

from app.core.config import IngestLimits
from app.ingest.validation import BatchValidator
from recovery.protocol.samples import (
    Batch,
    ParticipantReport,
    Sample,
    in_wire_order,
    make_sample,
    optional_fields,
    wire_fields,
)

NOW = 1_700_000_000.0


def test_the_spelling_is_pinned() -> None:
    assert wire_fields(Sample) == ("name", "value", "ts", "labels")
    assert optional_fields(Sample) == {"labels"}
    assert wire_fields(ParticipantReport) == ("job", "role", "rank", "phase", "step", "ts")
    assert optional_fields(ParticipantReport) == frozenset()
    assert wire_fields(Batch) == (
        "agent_id",
        "node",
        "seq",
        "sent_at",
        "samples",
        "participants",
        "fingerprint",
    )
    assert optional_fields(Batch) == {"participants", "fingerprint"}


def test_the_server_s_models_name_exactly_the_wire_fields() -> None:
    doc = BatchValidator(IngestLimits(), clock=lambda: NOW).doc_model
    assert tuple(doc.model_fields) == wire_fields(Batch)
    schema = doc.model_json_schema()
    assert tuple(schema["$defs"]["Sample"]["properties"]) == wire_fields(Sample)
    assert tuple(schema["$defs"]["Participant"]["properties"]) == wire_fields(ParticipantReport)
    assert set(schema["required"]) == set(wire_fields(Batch)) - optional_fields(Batch)


def _body(participants: list[ParticipantReport], samples: list[Sample]) -> bytes:
    # What the agent's spool stores plus what its sender stamps (agents/agent.py, sender.py).
    body = {"agent_id": "agent-1", "node": "node-1", "samples": samples}
    body |= {"participants": participants, "fingerprint": None}
    return orjson.dumps({**body, "seq": 3, "sent_at": NOW})


@pytest.mark.parametrize("path", ["typed", "exact"])
def test_what_an_agent_sends_the_server_reads_field_for_field(path: str) -> None:
    sent = [ParticipantReport("grpo", "trainer", 0, "TRAIN", 41, NOW - 2)]
    sample = make_sample("train_step", 41, NOW - 2, {"job": "grpo"})
    validator = BatchValidator(IngestLimits(), clock=lambda: NOW)
    body = _body(sent, [sample])
    if path == "typed":
        batch = validator._validate_typed(validator._typed.decode(body))  # noqa: SLF001
    else:
        batch = validator._validate_exact(body)  # noqa: SLF001
    assert batch is not None
    assert batch.participants == sent
    assert (batch.agent_id, batch.node, batch.seq, batch.sent_at) == ("agent-1", "node-1", 3, NOW)
    [(key, ts, value)] = batch.samples  # ValidBatch keeps (series, ts, value)
    assert (key.name, dict(key.labels), value, ts) == ("train_step", {"job": "grpo"}, 41.0, NOW - 2)


def test_a_participant_read_back_from_its_json_is_the_same() -> None:
    sent = ParticipantReport("grpo", "rollout", 3, "ROLLOUT", 0, NOW)
    assert ParticipantReport(**orjson.loads(orjson.dumps(sent))) == sent
    assert orjson.loads(orjson.dumps(sent)) == asdict(sent)


def test_a_decoder_that_drifted_from_the_contract_fails_where_it_is_built() -> None:
    spec = {"name": str, "value": float, "ts": float, "labels": dict}
    assert in_wire_order(Sample, spec, {"labels": {}})[-1] == ("labels", dict, {})
    with pytest.raises(ValueError, match="must name the fields"):
        in_wire_order(Sample, {**spec, "unit": str}, {"labels": {}})
    with pytest.raises(ValueError, match="defaults for"):
        in_wire_order(Sample, spec)  # "labels" may be left out: a decoder needs its default
