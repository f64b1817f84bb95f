from __future__ import annotations

import json
import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from app.core.config import IngestLimits
from app.ingest.validation import BatchValidator, IngestRejected
from app.series.store import SeriesKey

NOW = 1_800_000_000.0
LIMITS = IngestLimits(max_samples=20, max_labels=3, max_label_value_length=8, max_name_length=12)


def validator() -> BatchValidator:
    return BatchValidator(LIMITS, clock=lambda: NOW)


def body(samples: list[object], **extra: object) -> bytes:
    doc = {"agent_id": "a", "node": "n1", "seq": 1, "sent_at": NOW, "samples": samples, **extra}
    return json.dumps(doc).encode()


def test_keys_are_cached_per_node_and_label_order_insensitive() -> None:
    v = validator()
    b1 = v.validate(body([{"name": "m", "value": 1, "ts": NOW, "labels": {"a": "1", "b": "2"}}]))
    b2 = v.validate(body([{"name": "m", "value": 2.5, "ts": NOW, "labels": {"b": "2", "a": "1"}}]))
    assert b1.samples[0][0] == b2.samples[0][0] == SeriesKey.of("n1", "m", {"a": "1", "b": "2"})
    assert b1.samples[0][2] == 1.0 and isinstance(b1.samples[0][2], float)
    other = v.validate(
        body([{"name": "m", "value": 1, "ts": NOW, "labels": {"a": "1", "b": "2"}}], node="n2")
    )
    assert other.samples[0][0].node == "n2"


def test_a_cached_series_still_gets_every_per_sample_check() -> None:
    v = validator()
    good = {"name": "m", "value": 1.0, "ts": NOW, "labels": {"g": "0"}}
    v.validate(body([good]))
    for bad, needle in [
        ({**good, "value": "1"}, "samples[0].value"),
        ({**good, "ts": NOW + 10_000}, "samples[0].ts"),
        ({**good, "extra": 1}, "unknown field"),
        ({**good, "labels": None}, "samples[0].labels"),
        ({"name": "m", "value": 1.0, "labels": {"g": "0"}, "x": 1}, "samples[0].ts: missing"),
        ({"name": "m", "ts": NOW, "labels": {"g": "0"}}, "samples[0].value: missing"),
    ]:
        with pytest.raises(IngestRejected, match=needle.replace("[", r"\[").replace("]", r"\]")):
            v.validate(body([bad]))


def test_limits_come_from_settings() -> None:
    v = validator()
    s = {"name": "m", "value": 1.0, "ts": NOW}
    with pytest.raises(IngestRejected, match="21 samples, more than the limit of 20") as exc:
        v.validate(body([s] * 21))
    assert exc.value.kind == "limit"
    with pytest.raises(IngestRejected, match="4 labels, more than the limit of 3"):
        v.validate(body([{**s, "labels": {"a": "1", "b": "1", "c": "1", "d": "1"}}]))
    with pytest.raises(IngestRejected, match="longer than 8"):
        v.validate(body([{**s, "labels": {"a": "123456789"}}]))
    with pytest.raises(IngestRejected, match="longer than 12"):
        v.validate(body([{**s, "name": "m" * 13}]))
    small = BatchValidator(IngestLimits(max_body_bytes=50), clock=lambda: NOW)
    with pytest.raises(IngestRejected, match="more than the limit of 50") as exc:
        small.validate(body([s]))
    assert exc.value.status_code == 413


# -- the fast validator and the documented pydantic model accept exactly the same samples ------

names = st.one_of(
    st.sampled_from(["gpu_util", "a:b", "_x", "x1", "m" * 12, "m" * 13, "1x", "a-b", "", "é"]),
    st.integers(-5, 5),
)
label_keys = st.sampled_from(["gpu", "job", "_r", "0bad", "a-b", "k" * 65])
label_values = st.one_of(
    st.sampled_from(["0", "", "x" * 8, "x" * 9]), st.integers(-5, 5), st.none()
)
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
timestamps = st.one_of(
    st.floats(min_value=-10, max_value=NOW),
    st.integers(min_value=-5, max_value=int(NOW)),
    st.text(max_size=2),
)
samples = st.fixed_dictionaries(
    {"name": names, "value": numbers, "ts": timestamps},
    optional={
        "labels": st.one_of(
            st.dictionaries(label_keys, label_values, max_size=4), st.none(), st.integers(-5, 5)
        ),
        "unit": st.just("%"),
    },
)


valid_samples = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["gpu_util", "a:b", "_x", "x1"]),
        "value": st.one_of(
            st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**53), 2**53)
        ),
        "ts": st.floats(min_value=0, max_value=NOW),
    },
    optional={
        "labels": st.dictionaries(
            st.sampled_from(["gpu", "job", "_r"]), st.sampled_from(["0", "", "x" * 8]), max_size=3
        )
    },
)
SHARED = validator()  # shared on purpose: later examples run through the key cache


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(valid_samples, valid_samples, valid_samples, samples), max_size=4))
def test_fast_path_agrees_with_the_documented_model(batch: list[dict[str, object]]) -> None:
    v = SHARED
    raw = orjson.dumps({"agent_id": "a", "node": "n1", "seq": 1, "sent_at": NOW, "samples": batch})
    try:
        v.doc_model.model_validate(orjson.loads(raw))
        model_ok = True
    except ValidationError:
        model_ok = False
    try:
        out = v.validate(raw)
        fast_ok = True
    except IngestRejected:
        fast_ok = False
    assert fast_ok == model_ok, batch
    if fast_ok:
        assert all(isinstance(val, float) and math.isfinite(val) for _k, _t, val in out.samples)
        # a second pass (now from the key cache) gives the same answer
        assert v.validate(raw).samples == out.samples


# -- every number and string fits both databases and datetime (issue 17: -1e300 stopped ingest) --

PARTICIPANT = {"job": "j", "role": "trainer", "rank": 0, "phase": "TRAIN", "step": 1, "ts": NOW}
SAMPLE = {"name": "m", "value": 1.0, "ts": NOW, "labels": {"g": "0"}}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"participants": [{**PARTICIPANT, "ts": -1e300}]}, "participants.0.ts"),
        ({"participants": [{**PARTICIPANT, "ts": -1.0}]}, "participants.0.ts"),
        ({"participants": [{**PARTICIPANT, "ts": 1e300}]}, "participants.0.ts"),
        ({"participants": [{**PARTICIPANT, "ts": NOW + 601}]}, r"participants\[0\].ts"),
        ({"participants": [{**PARTICIPANT, "step": 2**31}]}, "participants.0.step"),
        ({"participants": [{**PARTICIPANT, "rank": 1_000_001}]}, "participants.0.rank"),
        ({"sent_at": -1e300}, "sent_at"),
        ({"sent_at": 1e300}, "sent_at"),
        ({"sent_at": NOW + 601}, "sent_at"),
        ({"seq": 2**62 + 1}, "seq"),
        ({"fingerprint": {"torch": "2\x00"}}, "fingerprint.torch"),
        ({"fingerprint": {"a\x00": "1"}}, "fingerprint"),
        ({"samples": [{**SAMPLE, "value": 1e301}]}, r"samples\[0\].value"),
        ({"samples": [{**SAMPLE, "value": -1.7e308}]}, r"samples\[0\].value"),
        ({"samples": [{**SAMPLE, "value": 10**301}]}, r"samples\[0\].value"),
        ({"samples": [{**SAMPLE, "ts": -1e300}]}, r"samples\[0\].ts"),
        ({"samples": [{**SAMPLE, "labels": {"g": "0\x00"}}]}, r"samples\[0\].labels.g"),
    ],
)
def test_every_number_and_string_is_bounded(extra: dict[str, object], field: str) -> None:
    v = validator()
    ok = {"samples": [SAMPLE], "participants": [PARTICIPANT], "fingerprint": {"torch": "2"}}
    v.validate(body(**ok))  # the same batch within the bounds passes (and caches the series)
    doc = {**ok, **extra}
    with pytest.raises(IngestRejected, match=field) as exc:
        v.validate(body(**doc))
    assert exc.value.status_code == 422


def test_the_bounds_themselves_are_accepted() -> None:
    v = BatchValidator(IngestLimits(max_future_skew_seconds=1e308), clock=lambda: NOW)
    far = 253_402_300_799.0  # 9999-12-31 23:59:59 UTC
    out = v.validate(
        body(
            [{**SAMPLE, "value": 1e300, "ts": far}, {**SAMPLE, "value": -1e300, "ts": 0.0}],
            sent_at=far,
            participants=[{**PARTICIPANT, "ts": far}, {**PARTICIPANT, "ts": 0, "rank": 1}],
        )
    )
    assert [p.ts for p in out.participants] == [far, 0]
    with pytest.raises(IngestRejected, match="sent_at"):
        v.validate(body([SAMPLE], sent_at=far + 1))
