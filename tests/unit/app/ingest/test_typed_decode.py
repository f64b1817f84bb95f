"""The typed (msgspec) path of ingest validation: it accepts exactly what the exact path accepts,
with the same result, and every refused body gets the exact path's documented message.

``BatchValidator._validate_typed`` answering None (``typed_path`` below) means "the exact path decides"; a body it
wrongly accepted would come back as a batch from ``validate`` and fail these tests.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.config import IngestLimits
from app.ingest.typed_decode import DECODE_FAILED
from app.ingest.validation import BatchValidator, IngestRejected, ValidBatch
from app.series.store import SeriesKey

NOW = 1_800_000_000.0
LIMITS = IngestLimits(max_samples=20, max_labels=3, max_label_value_length=8, max_name_length=12)
# One valid body; VAL is the first sample's value.
GOOD = (
    b'{"agent_id":"a","node":"n1","seq":1,"sent_at":1800000000.0,"samples":[{"name":"m",'
    b'"value":VAL,"ts":1800000000.0,"labels":{"g":"0"}}]}'
)
PART = b'{"job":"j","role":"r","rank":0,"phase":"P","step":0,"ts":1.0}'


def typed_path(v: BatchValidator, body: bytes) -> ValidBatch | None:
    """The typed path's answer for ``body``: its batch, or None (the exact path decides)."""
    try:
        doc = v._typed.decode(body)  # noqa: SLF001
    except DECODE_FAILED:
        return None
    return v._validate_typed(doc)  # noqa: SLF001


def validator() -> BatchValidator:
    return BatchValidator(LIMITS, clock=lambda: NOW)


def good(value: bytes = b"1.5") -> bytes:
    return GOOD.replace(b"VAL", value)


def edit(old: bytes, new: bytes, value: bytes = b"1") -> bytes:
    body = good(value)
    assert old in body
    return body.replace(old, new, 1)


def with_participant(rank: bytes = b"0", step: bytes = b"0") -> bytes:
    part = b'{"job":"j","role":"r","rank":RANK,"phase":"P","step":STEP,"ts":1.0}'
    part = part.replace(b"RANK", rank).replace(b"STEP", step)
    return edit(b'"seq":1', b'"seq":1,"participants":[' + part + b"]")


# (body, status, the exact message): each is what docs/api.md promises (400 for what JSON cannot
# hold, 422 naming the field and the value) and what the exact path has always answered.
CASES: dict[str, tuple[bytes, int, str]] = {
    "NaN": (
        good(b"NaN"),
        400,
        "body is not valid JSON: unexpected character, expected a JSON value: line 1 column 91 (char 90) (NaN and Infinity are not JSON numbers; only finite values are accepted)",
    ),
    "Infinity": (
        good(b"Infinity"),
        400,
        "body is not valid JSON: unexpected character, expected a JSON value: line 1 column 91 (char 90) (NaN and Infinity are not JSON numbers; only finite values are accepted)",
    ),
    "-Infinity": (
        good(b"-Infinity"),
        400,
        "body is not valid JSON: no digit after sign: line 1 column 92 (char 91) (NaN and Infinity are not JSON numbers; only finite values are accepted)",
    ),
    "overflowing float": (
        good(b"1e999"),
        400,
        "body is not valid JSON: number is infinity when parsed as double: line 1 column 91 (char 90) (NaN and Infinity are not JSON numbers; only finite values are accepted)",
    ),
    "overflowing int": (
        good(b"1" + b"0" * 400),
        400,
        "body is not valid JSON: number is infinity when parsed as double: line 1 column 91 (char 90) (NaN and Infinity are not JSON numbers; only finite values are accepted)",
    ),
    "huge int value": (
        good(b"1" + b"0" * 301),
        422,
        "samples[0].value: 1e+301 is outside -1e+300..1e+300",
    ),
    "huge int seq": (
        edit(b'"seq":1', b'"seq":18446744073709551616'),
        422,
        "seq: Input should be a valid integer (got 1.8446744073709552e+19)",
    ),
    "float seq": (
        edit(b'"seq":1', b'"seq":1.0'),
        422,
        "seq: Input should be a valid integer (got 1.0)",
    ),
    "value a string": (good(b'"1"'), 422, "samples[0].value: must be a number, got '1'"),
    "value a bool": (good(b"true"), 422, "samples[0].value: must be a number, got True"),
    "value null": (good(b"null"), 422, "samples[0].value: must be a number, got None"),
    "ts a string": (
        edit(b'"ts":1800000000.0', b'"ts":"x"'),
        422,
        "samples[0].ts: must be a number, got 'x'",
    ),
    "ts ahead of the clock": (
        edit(b'"ts":1800000000.0', b'"ts":1800000601.0'),
        422,
        "samples[0].ts: 1800000601.0 is negative or more than 600 s ahead of the server clock",
    ),
    "sent_at ahead of the clock": (
        edit(b'"sent_at":1800000000.0', b'"sent_at":1800000601.0'),
        422,
        "sent_at: 1800000601.0 is more than 600 s ahead of the server clock (or after 253402300799, 9999-12-31)",
    ),
    "name not a string": (
        edit(b'"name":"m"', b'"name":5'),
        422,
        "samples[0].name: 5 does not match ^[a-zA-Z_:][a-zA-Z0-9_:]*$",
    ),
    "labels a list": (
        edit(b'{"g":"0"}', b'["g","0"]'),
        422,
        "samples[0].labels: must be an object, got ['g', '0']",
    ),
    "labels null": (
        edit(b'{"g":"0"}', b"null"),
        422,
        "samples[0].labels: must be an object, got None",
    ),
    "label value not a string": (
        edit(b'{"g":"0"}', b'{"g":0}'),
        422,
        "samples[0].labels.g: must be a string, got 0",
    ),
    "NUL in a label value": (
        edit(b'{"g":"0"}', b'{"g":"a\\u0000"}'),
        422,
        "samples[0].labels.g: must not contain NUL (U+0000), got 'a\\x00'",
    ),
    "NUL in a fingerprint key": (
        edit(b'"seq":1', b'"seq":1,"fingerprint":{"a\\u0000":"1"}'),
        422,
        "fingerprint.a\x00.[key]: String should match pattern '^[^\\x00]*$' (got 'a\\x00')",
    ),
    "unknown top-level field": (
        edit(b'"seq":1', b'"seq":1,"extra":1'),
        422,
        "extra: Extra inputs are not permitted (got 1)",
    ),
    "unknown sample field": (
        edit(b'"name":"m"', b'"name":"m","unit":"%"'),
        422,
        "samples[0]: unknown field(s) ['unit']",
    ),
    "unknown participant field": (
        edit(b'"seq":1', b'"seq":1,"participants":[' + PART[:-1] + b',"x":1}]'),
        422,
        "participants.0.x: Extra inputs are not permitted (got 1)",
    ),
    "rank a bool": (
        with_participant(rank=b"true"),
        422,
        "participants.0.rank: Input should be a valid integer (got True)",
    ),
    "step a float": (
        with_participant(step=b"1.0"),
        422,
        "participants.0.step: Input should be a valid integer (got 1.0)",
    ),
    # duplicate keys: the last one counts, on both paths (orjson and msgspec agree)
    "duplicate value, the last bad": (
        good(b'1,"value":"x"'),
        422,
        "samples[0].value: must be a number, got 'x'",
    ),
    "duplicate seq, the last bad": (
        edit(b'"seq":1', b'"seq":1,"seq":-1'),
        422,
        "seq: Input should be greater than or equal to 0 (got -1)",
    ),
    "duplicate label, the last bad": (
        edit(b'{"g":"0"}', b'{"g":"0","g":5}'),
        422,
        "samples[0].labels.g: must be a string, got 5",
    ),
    "node with a final newline": (
        edit(b'"node":"n1"', b'"node":"n1\\n"'),
        422,
        "node: String should match pattern '^[A-Za-z0-9_][A-Za-z0-9_.:@/-]*$' (got 'n1\\n')",
    ),
    # not UTF-8: in a decoded string, in a label value (msgspec leaves that text raw), in the
    # fingerprint; a lone surrogate escape; a byte order mark
    "non-UTF-8 name": (
        edit(b'"name":"m"', b'"name":"m\xff"'),
        400,
        "body is not valid JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
    ),
    "non-UTF-8 label value": (
        edit(b'{"g":"0"}', b'{"g":"\xff"}'),
        400,
        "body is not valid JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
    ),
    "non-UTF-8 fingerprint": (
        edit(b'"seq":1', b'"seq":1,"fingerprint":{"t":"\xc3"}'),
        400,
        "body is not valid JSON: str is not valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
    ),
    "lone surrogate": (
        edit(b'"node":"n1"', b'"node":"\\ud800"'),
        400,
        "body is not valid JSON: no low surrogate in string: line 1 column 25 (char 24)",
    ),
    "byte order mark": (
        b"\xef\xbb\xbf" + good(),
        400,
        "body is not valid JSON: UTF-8 byte order mark (BOM) is not supported: line 1 column 1 (char 0)",
    ),
    "empty body": (
        b"",
        400,
        "body is not valid JSON: Input is a zero-length, empty document: line 1 column 1 (char 0)",
    ),
    "body a list": (b"[1]", 422, "body must be a JSON object, got list"),
    "body a string": (b'"x"', 422, "body must be a JSON object, got str"),
    "body null": (b"null", 422, "body must be a JSON object, got NoneType"),
    "body a number": (b"1", 422, "body must be a JSON object, got int"),
}


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "series-cached"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refused_body_gets_the_documented_message(case: str, warm: bool) -> None:
    body, status, message = CASES[case]
    v = validator()
    if warm:  # the body's series passed once: the typed path finds it in its cache
        assert typed_path(v, good()) is not None
    assert typed_path(v, body) is None  # the typed path never accepts it
    with pytest.raises(IngestRejected) as exc:
        v.validate(body)
    assert (exc.value.status_code, str(exc.value)) == (status, message)


def test_valid_bodies_take_the_typed_path_with_the_exact_result() -> None:
    v = validator()
    body = (
        b'{"agent_id":"a","node":"n1","seq":4611686018427387904,"sent_at":0,"samples":['
        b'{"name":"m","value":1,"ts":1800000000,"labels":{"b":"2","a":"1"}},'
        b'{"name":"m","value":-0.0,"ts":0.5,"labels":{"a":"1","b":"2"}},'
        b'{"name":"m","value":18446744073709551617,"ts":1.0,"labels":{ "a" : "1" , "b":"2" }},'
        b'{"name":"m","value":1e300,"ts":2.0,"labels":{"a":"1","b":"2","a":"1"}},'
        b'{"name":"n:x","value":5e-324,"ts":3.0},'
        b'{"name":"n:x","value":-1e300,"ts":4.0,"labels":{}}],'
        b'"participants":[{"job":"j","role":"r","rank":1000000,"phase":"P","step":2147483647,"ts":1}],'
        b'"fingerprint":{"torch":"2.13","driver":"\\u00e9\\n"}}'
    )
    before = v.typed_accepted
    out = v.validate(body)
    assert v.typed_accepted == before + 1
    assert_same(out, v._validate_exact(body))
    key = SeriesKey.of("n1", "m", {"a": "1", "b": "2"})
    assert [s[0] for s in out.samples[:4]] == [key] * 4  # four spellings of one series
    assert [s[0] for s in out.samples[4:]] == [SeriesKey.of("n1", "n:x")] * 2
    assert all(type(x) is float for _k, ts, val in out.samples for x in (ts, val))
    assert math.copysign(1.0, out.samples[1][2]) == -1.0
    assert out.seq == 2**62 and out.participants[0].ts == 1.0
    assert out.fingerprint == {"torch": "2.13", "driver": "é\n"}
    # again, now every series comes from the cache
    assert_same(v.validate(body), out)


def test_a_duplicate_key_counts_by_its_last_value_on_both_paths() -> None:
    v = validator()
    # msgspec refuses the first (bad) occurrence while decoding; the exact path, like orjson,
    # keeps the last one and accepts: the verdict is the exact path's
    body = good(b'"x","value":2')
    assert typed_path(v, body) is None
    assert v.validate(body).samples[0][2] == 2.0
    # both good: the last counts on the typed path too (a bad last one: CASES)
    assert typed_path(v, good(b'1,"value":3')) is not None
    assert v.validate(good(b'1,"value":3')).samples[0][2] == 3.0


def test_the_typed_path_honours_the_clock_and_the_key_cache_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [NOW]
    v = BatchValidator(LIMITS, clock=lambda: now[0])
    body = edit(b'"ts":1800000000.0', b'"ts":1800000500.0')
    assert typed_path(v, body) is not None
    now[0] = NOW - 200  # the same sample is now more than 600 s ahead
    assert typed_path(v, body) is None
    with pytest.raises(IngestRejected, match=r"samples\[0\].ts: 1800000500.0 is negative"):
        v.validate(body)
    now[0] = NOW
    monkeypatch.setattr("app.ingest.validation._KEY_CACHE_LIMIT", 2)
    for i in range(5):  # more new series than the cache holds: it is emptied and refilled
        out = v.validate(edit(b'{"g":"0"}', f'{{"g":"{i}"}}'.encode()))
        assert out.samples[0][0] == SeriesKey.of("n1", "m", {"g": str(i)})
    # the limit, plus the entry that found it full (the exact path's cache counts the same way)
    assert sum(len(k) for k in v._text_keys.values()) <= 3


def assert_same(a: ValidBatch, b: ValidBatch) -> None:
    """Equal, and the floats bit for bit (-0.0 is not 0.0 here)."""
    assert (a.agent_id, a.node, a.seq, repr(a.sent_at)) == (
        b.agent_id,
        b.node,
        b.seq,
        repr(b.sent_at),
    )
    assert [(k, repr(t), repr(x)) for k, t, x in a.samples] == [
        (k, repr(t), repr(x)) for k, t, x in b.samples
    ]
    assert [(p.job, p.role, p.rank, p.phase, p.step, repr(p.ts)) for p in a.participants] == [
        (p.job, p.role, p.rank, p.phase, p.step, repr(p.ts)) for p in b.participants
    ]
    assert (list(a.fingerprint.items()) if a.fingerprint is not None else None) == (
        list(b.fingerprint.items()) if b.fingerprint is not None else None
    )


# -- hypothesis: the two paths agree on any body ---------------------------------------------

_EDGE_NUMBERS = [
    0,
    -1,
    1,
    2**31 - 1,
    2**31,
    2**53 + 1,
    2**62,
    2**62 + 1,
    2**63 - 1,
    2**63,
    2**64,
    2**64 + 1,
    -(2**63),
    -(2**63) - 1,
    10**30,
    10**300,
    10**301,
    -1e300,
    1e300,
    1e301,
    1.7976931348623157e308,
    5e-324,
    -0.0,
    253402300799.0,
    253402300800.0,
    NOW + 599,
    NOW + 601,
    1_000_000,
    1_000_001,
]
_EDGE_TEXT = [
    "",
    "\x00",
    "a\x00b",
    "n9\n",
    " ",
    "é",
    "\u2028",
    "x" * 130,
    "../x",
    "-a",
    "a:b",
    "gpu",
    "m" * 13,
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from(_EDGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(_EDGE_TEXT),
)
# any JSON value, two levels deep
shallow = st.one_of(
    scalars,
    st.lists(scalars, max_size=2),
    st.dictionaries(st.text(max_size=4), scalars, max_size=2),
)
anything = st.one_of(
    shallow,
    st.lists(shallow, max_size=2),
    st.dictionaries(st.text(max_size=4), shallow, max_size=2),
)
numbers = st.one_of(
    st.sampled_from(_EDGE_NUMBERS),
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**70), 2**70),
)
texts = st.one_of(st.sampled_from(_EDGE_TEXT), st.text(max_size=6))
labels = st.dictionaries(
    st.one_of(st.sampled_from(["gpu", "job", "_r", "0bad"]), texts),
    st.one_of(texts, anything),
    max_size=4,
)
samples = st.fixed_dictionaries(
    {
        "name": st.one_of(st.sampled_from(["gpu_util", "a:b", "_x", "m" * 12]), texts, anything),
        "value": st.one_of(numbers, anything),
        "ts": st.one_of(numbers, anything),
    },
    optional={"labels": st.one_of(labels, anything), "unit": anything},
)
participants = st.fixed_dictionaries(
    {
        "job": st.one_of(st.sampled_from(["j1", "x.y:z@w/v"]), texts),
        "role": st.one_of(st.just("trainer"), texts),
        "rank": st.one_of(numbers, anything),
        "phase": st.one_of(st.just("TRAIN"), texts),
        "step": st.one_of(numbers, anything),
        "ts": st.one_of(numbers, anything),
    },
    optional={"x": anything},
)
bodies = st.fixed_dictionaries(
    {
        "agent_id": st.one_of(st.just("agent"), texts, anything),
        "node": st.one_of(st.just("n1"), texts),
        "seq": st.one_of(numbers, anything),
        "sent_at": st.one_of(numbers, anything),
        "samples": st.one_of(st.lists(samples, max_size=4), anything),
    },
    optional={
        "participants": st.one_of(st.lists(participants, max_size=2), anything),
        "fingerprint": st.one_of(
            st.dictionaries(texts, st.one_of(texts, anything), max_size=2), anything
        ),
        "extra": anything,
    },
)
# plausible numbers and names most of the time, so that many bodies pass and the results are
# compared, not only the refusals
plausible = st.fixed_dictionaries(
    {
        "agent_id": st.just("agent"),
        "node": st.just("n1"),
        "seq": st.integers(0, 2**62),
        "sent_at": st.floats(0, NOW),
        "samples": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["gpu_util", "a:b", "_x"]),
                    "value": numbers,
                    "ts": st.one_of(st.floats(0, NOW + 600), st.integers(0, int(NOW))),
                },
                optional={
                    "labels": st.dictionaries(
                        st.sampled_from(["gpu", "job"]),
                        st.sampled_from(["0", "", "é", "x" * 8]),
                        max_size=2,
                    )
                },
            ),
            max_size=4,
        ),
    },
    optional={
        "participants": st.lists(participants, max_size=1),
        "fingerprint": st.dictionaries(texts, texts, max_size=2),
    },
)
SHARED = validator()  # shared on purpose: later examples run through the series cache


def _encode(doc: Any, spaced: bool) -> bytes:
    # Python's json writes huge ints as they are; spacing makes other labels texts of a series
    return json.dumps(
        doc, separators=(", ", " : ") if spaced else (",", ":"), ensure_ascii=spaced
    ).encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.one_of(plausible, plausible, bodies, anything), spaced=st.booleans())
def test_the_typed_path_agrees_with_the_exact_path(doc: Any, spaced: bool) -> None:
    try:
        raw = _encode(doc, spaced)
    except ValueError:  # an int Python refuses to write (over 4300 digits)
        return
    v = SHARED
    typed = typed_path(v, raw)
    try:
        exact: ValidBatch | None = v._validate_exact(raw)
    except IngestRejected:
        exact = None
    # the same verdict (a valid body never needs the exact path), and the same batch
    assert (typed is None) == (exact is None), raw
    event("accepted" if exact is not None else "refused")
    if typed is not None and exact is not None:
        assert_same(typed, exact)
