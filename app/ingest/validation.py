"""Validation of ``POST /api/v1/ingest`` bodies (the shape: ``recovery.protocol.samples``).

Two paths, one set of rules and messages:

* the typed path (``app.ingest.typed_decode``, the hot path): msgspec decodes and checks types,
  bounds, patterns, sizes and unknown fields in one pass; then timestamps against the clock, and
  each sample's series looked up in a cache of the series that passed, so the name and label
  rules run once per series. It only ever accepts: any doubt hands the body to
* the exact path (``_validate_exact``): orjson, the pydantic envelope and the per-sample loop,
  which find the first violation and name it. Every 4xx message comes from here.

Both paths accept exactly the same bodies with the same result (the unit tests check both,
hypothesis included). A violation raises ``IngestRejected`` naming the field and the bad value,
and nothing of the batch is applied. Every number and string is bounded to what both databases
and ``datetime`` hold (``app.ingest.wire_rules``), so a batch that passes can always be
committed: one that could not would stop the group commit for every node.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
from msgspec.structs import astuple
from pydantic import ValidationError

from app.core.config import IngestLimits
from app.core.errors import InvalidInput, PayloadTooLarge, ServiceError
from app.ingest.typed_decode import (
    DECODE_FAILED,
    NO_LABELS,
    TypedBatch,
    TypedDecoder,
    TypedSample,
)
from app.ingest.wire_rules import (
    DECODE_BOUNDS,
    LABEL_NAME_PATTERN,
    MAX_ABS_VALUE,
    MAX_TIMESTAMP,
    METRIC_NAME_PATTERN,
    MIN_TIMESTAMP,
    build_models,
)
from app.series.store import SeriesKey
from recovery.protocol.samples import ParticipantReport, Sample, wire_fields

_METRIC_NAME_RE = re.compile(METRIC_NAME_PATTERN)
_LABEL_NAME_RE = re.compile(LABEL_NAME_PATTERN)
_SAMPLE_FIELDS = frozenset(wire_fields(Sample))
_KEY_CACHE_LIMIT = 200_000
# New series checked in one piece (~10 us each on a 2-core host) before other requests run.
NEW_SERIES_SLICE = 250
# One node's share: a node sending new series in every batch (a flood, or label churn) empties
# only its own cache, not every node's (which made each node's samples take the slow path).
_KEY_CACHE_LIMIT_PER_NODE = 20_000
_MISSING = object()


class BatchGate(Protocol):
    """One batch's early quota checks: told each series new to the validator's cache."""

    def new_series(self, key: SeriesKey) -> None:
        """Raise ``IngestRejected`` when the batch may not hold ``key`` too."""

    def expect_new(self, count: int) -> None:
        """The batch holds ``count`` series the validator's cache does not know: raise a retry
        (429) at once when the node may not create that many now, before any is validated."""


class NewSeriesGate(Protocol):
    """Asked while a batch is validated (the per-node quotas, ``app.ingest.quotas``):
    validating a new series is the costly part of a batch, so one that cannot pass its node's
    quotas is refused as soon as that is known, not after all of it was checked."""

    def begin_batch(self, node: str, participants: list[ParticipantReport]) -> BatchGate:
        """The checks of a batch of ``node`` (raises at once over the process quotas)."""

    def holds(self, key: SeriesKey) -> bool:
        """Whether the node of ``key`` holds that series: the cache keeps these."""


class IngestRejected(ServiceError):
    """A batch refused as a whole; ``status_code`` is the HTTP status, the message the reason."""

    def __init__(self, reason: str, *, status_code: int = 422, kind: str = "invalid") -> None:
        super().__init__(reason)
        self.status_code = status_code
        # low-cardinality reason class for the rejection counter
        self.kind = kind


@dataclass(slots=True)
class ValidBatch:
    agent_id: str
    node: str
    seq: int
    sent_at: float
    samples: list[tuple[SeriesKey, float, float]]
    participants: list[ParticipantReport]
    fingerprint: dict[str, str] | None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _not_a_number(i: int, field: str, sample: dict[str, Any]) -> str:
    if field not in sample:
        return f"samples[{i}].{field}: missing"
    return f"samples[{i}].{field}: must be a number, got {_short(sample[field])}"


def _pydantic_reason(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        got = f" (got {_short(err['input'])})" if err["type"] != "missing" else ""
        parts.append(f"{loc}: {err['msg']}{got}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class _ManyNewSeries(Exception):
    """The typed path met a batch with more new series than one slice: check them in slices."""


class BatchValidator:
    """Parses and checks one ingest body against ``limits``; keeps a cache of valid series."""

    def __init__(self, limits: IngestLimits, *, clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self._clock = clock
        self._envelope, self.doc_model = build_models(limits)
        self._typed = TypedDecoder(limits, DECODE_BOUNDS)
        # For series that passed every check, node -> (metric name, labels) -> key; labels as
        # orjson decoded them (exact path) or as their JSON text (typed path).
        self._keys: dict[str, dict[tuple[str, tuple[tuple[Any, Any], ...]], SeriesKey]] = {}
        self._text_keys: dict[str, dict[tuple[str, bytes], SeriesKey]] = {}
        self._cached_keys = 0
        self._cached_per_node: dict[str, int] = {}
        self._token_node: str | None = None
        self.typed_accepted = 0  # batches the typed path accepted (the rest went the exact way)
        # Set by ingest: the quotas' early refusal of a batch's new series (NewSeriesGate).
        self.gate: NewSeriesGate | None = None
        self._batch_gate: BatchGate | None = None  # the checks of the batch validated now

    def validate(self, body: bytes, *, token_node: str | None = None) -> ValidBatch:
        """The batch in ``body``, or ``IngestRejected`` naming its first fault. With
        ``token_node`` (the node of the request's token), a batch of that node with more new
        series than it may create is refused early (``gate``)."""
        slices = self.validate_in_slices(body, token_node=token_node)
        while True:
            try:
                next(slices)
            except StopIteration as done:
                return cast(ValidBatch, done.value)

    def validate_in_slices(
        self, body: bytes, *, token_node: str | None = None
    ) -> Generator[None, None, ValidBatch]:
        """``validate`` in pieces: yields between slices of ``NEW_SERIES_SLICE`` series new to
        the cache, where the caller serves other requests (checking a fresh agent's first batch,
        or a flood's, takes 30-100 ms otherwise held in one piece); returns the batch."""
        self._token_node = token_node
        if len(body) > self.limits.max_body_bytes:
            raise IngestRejected(
                f"body is {len(body)} bytes, more than the limit of {self.limits.max_body_bytes}",
                status_code=PayloadTooLarge.status_code,
                kind="too_large",
            )
        try:
            doc: TypedBatch | None = self._typed.decode(body)
        except DECODE_FAILED:
            doc = None
        batch = None
        if doc is not None:
            try:
                batch = self._validate_typed(doc, slice_new=True)
            except _ManyNewSeries:
                yield from self._new_series_in_slices(doc)
                self._token_node = token_node  # other batches were validated between the slices
                batch = self._validate_typed(doc)
        if batch is not None:
            self.typed_accepted += 1
            return batch
        return self._validate_exact(body)

    def _new_series_in_slices(self, doc: TypedBatch) -> Iterator[None]:
        """Fill the cache with the batch's new series, a slice at a time, each told to the
        batch's early quota checks as ``_validate_typed`` would; anything in doubt is left to
        ``_validate_typed``, which then judges the whole batch."""
        known = self._text_keys.get(doc.node, {})
        fresh = [
            s
            for k, s in {(s.name, bytes(s.labels)): s for s in doc.samples}.items()
            if k not in known
        ]
        gate = self._batch_gate
        for at in range(0, len(fresh), NEW_SERIES_SLICE):
            if at:
                yield
                self._batch_gate = gate  # whatever was validated meanwhile set its own
            for s in fresh[at : at + NEW_SERIES_SLICE]:
                if self._typed_series(doc.node, s) is None:
                    return

    def _validate_typed(self, doc: TypedBatch, *, slice_new: bool = False) -> ValidBatch | None:
        """The batch when the typed path accepts it; None sends it to the exact path. With
        ``slice_new``, raises ``_ManyNewSeries`` at the first series new to the cache when the
        batch holds more than ``NEW_SERIES_SLICE`` of them (after the quotas' count of them)."""
        horizon = self._horizon()
        if doc.sent_at > horizon:
            return None
        parts = []
        for p in doc.participants:
            report = ParticipantReport(*astuple(p))  # the decoder's fields are in wire order
            if report.ts > horizon:
                return None
            parts.append(report)
        node = doc.node
        self._begin_batch(node, parts)
        keys = self._text_keys.get(node)
        if keys is None:
            keys = self._text_keys[node] = {}
        lookup = keys.get
        samples: list[tuple[SeriesKey, float, float]] = []
        append = samples.append
        counted = self._batch_gate is None and not slice_new
        for s in doc.samples:
            ts = s.ts
            if ts > horizon:
                return None
            key = lookup((s.name, bytes(s.labels)))
            if key is None:
                if not counted:
                    counted = True  # at the first miss: how many, before validating any
                    unknown = {(t.name, bytes(t.labels)) for t in doc.samples}.difference(keys)
                    if self._batch_gate is not None:
                        self._batch_gate.expect_new(len(unknown))
                    if slice_new and len(unknown) > NEW_SERIES_SLICE:
                        raise _ManyNewSeries
                key = self._typed_series(node, s)
                if key is None:
                    return None
            append((key, ts, s.value))
        return ValidBatch(
            agent_id=doc.agent_id,
            node=node,
            seq=doc.seq,
            sent_at=doc.sent_at,
            samples=samples,
            participants=parts,
            fingerprint=doc.fingerprint,
        )

    def _typed_series(self, node: str, s: TypedSample) -> SeriesKey | None:
        """The key of a series the typed path has not seen: its labels text parsed and checked
        by the exact path's rules (``_new_series``); None when anything fails."""
        text = bytes(s.labels)
        sample: dict[str, Any] = {"name": s.name, "value": s.value, "ts": s.ts}
        if text != NO_LABELS:
            try:
                sample["labels"] = orjson.loads(text)
            except orjson.JSONDecodeError:
                return None
        try:
            key = self._new_series(0, node, sample)
        except IngestRejected as exc:
            if exc.kind == "quota":  # the node may not create it: final, whichever path
                raise
            return None
        self._text_keys.setdefault(node, {})[(s.name, text)] = key
        return key

    def _validate_exact(self, body: bytes) -> ValidBatch:
        """Today's checks in the documented order: raises ``IngestRejected`` naming the first
        violation, or returns the batch."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            hint = ""
            if b"NaN" in body or b"Infinity" in body or "infinity" in str(exc):
                hint = " (NaN and Infinity are not JSON numbers; only finite values are accepted)"
            raise IngestRejected(
                f"body is not valid JSON: {exc}{hint}", status_code=400, kind="bad_json"
            ) from None
        if type(data) is not dict:
            raise IngestRejected(f"body must be a JSON object, got {type(data).__name__}")
        # Samples are taken out and checked by the loop below, not by pydantic (hot path).
        raw_samples = data.pop("samples", _MISSING)
        try:
            env = self._envelope.model_validate(data)
        except ValidationError as exc:
            too_many = [e for e in exc.errors() if e["type"] == "too_long"]
            raise IngestRejected(
                _pydantic_reason(exc), kind="limit" if too_many else "invalid"
            ) from None
        if raw_samples is _MISSING:
            raise IngestRejected("samples: missing")
        if type(raw_samples) is not list:
            raise IngestRejected(f"samples: must be a list, got {_short(raw_samples)}")
        if len(raw_samples) > self.limits.max_samples:
            raise IngestRejected(
                f"samples: {len(raw_samples)} samples, more than the limit of "
                f"{self.limits.max_samples}",
                kind="limit",
            )
        parts = [ParticipantReport(**p.model_dump()) for p in env.participants]  # type: ignore[attr-defined]
        self._begin_batch(env.node, parts)  # type: ignore[attr-defined]
        samples = self._check_samples(env.node, raw_samples)  # type: ignore[attr-defined]
        horizon = self._horizon()
        if env.sent_at > horizon:  # type: ignore[attr-defined]
            raise IngestRejected(self._future("sent_at", env.sent_at))  # type: ignore[attr-defined]
        for i, p in enumerate(parts):
            if p.ts > horizon:
                raise IngestRejected(self._future(f"participants[{i}].ts", p.ts))
        return ValidBatch(
            agent_id=env.agent_id,  # type: ignore[attr-defined]
            node=env.node,  # type: ignore[attr-defined]
            seq=env.seq,  # type: ignore[attr-defined]
            sent_at=env.sent_at,  # type: ignore[attr-defined]
            samples=samples,
            participants=parts,
            fingerprint=env.fingerprint,  # type: ignore[attr-defined]
        )

    def _evict(self, nodes: list[str]) -> None:
        """Forget the cached series of ``nodes``, except those their quotas hold: a cache miss
        then means a series new to the node (``BatchGate.expect_new`` counts on it)."""
        gate = self.gate
        for n in nodes:
            for cache in (self._keys, self._text_keys):
                held: dict[Any, SeriesKey] | None = cache.get(n)
                kept = {k: v for k, v in (held or {}).items() if gate and gate.holds(v)}
                if kept:
                    cache[n] = kept
                else:
                    cache.pop(n, None)
            added = self._cached_per_node.pop(n, 0)
            self._cached_keys -= added
        if len(nodes) > 1:
            self._cached_keys, self._cached_per_node = 0, {}

    def _begin_batch(self, node: str, participants: list[ParticipantReport]) -> None:
        """Start the quotas' early checks of a batch of ``node``: only the token's own node
        (another node's quota is never charged for a body that is refused 403 anyway)."""
        # Bounded memory under label churn, trimmed between batches (never a key of the batch
        # being validated, before it could be admitted); refills from the next batches.
        if self._cached_per_node.get(node, 0) > _KEY_CACHE_LIMIT_PER_NODE:
            self._evict([node])
        elif self._cached_keys > _KEY_CACHE_LIMIT:
            self._evict(list(self._keys.keys() | self._text_keys.keys()))
        gated = self.gate is not None and node == self._token_node
        self._batch_gate = None  # the checks below may refuse the batch at once
        if gated and self.gate is not None:
            self._batch_gate = self.gate.begin_batch(node, participants)

    def _horizon(self) -> float:
        """The latest timestamp accepted now: the clock plus the allowed skew, within datetime."""
        return min(self._clock() + self.limits.max_future_skew_seconds, MAX_TIMESTAMP)

    def _future(self, where: str, ts: float) -> str:
        return (
            f"{where}: {ts!r} is more than {self.limits.max_future_skew_seconds:g} s ahead of "
            f"the server clock (or after {MAX_TIMESTAMP:.0f}, 9999-12-31)"
        )

    def _check_samples(self, node: str, raw: list[Any]) -> list[tuple[SeriesKey, float, float]]:
        """The fast loop: a sample of a known series with float value and ts passes with a few
        lookups; anything else goes through ``_check_one``, which applies every rule."""
        out: list[tuple[SeriesKey, float, float]] = []
        append = out.append
        keys = self._keys.get(node)
        if keys is None:
            keys = self._keys[node] = {}
        horizon = self._horizon()
        counted = self._batch_gate is None
        for i, s in enumerate(raw):
            try:
                value = s["value"]
                ts = s["ts"]
                labels = s.get("labels")
                key = keys[(s["name"], tuple(labels.items()) if labels is not None else ())]
            except (KeyError, TypeError, AttributeError):
                if not counted and self._batch_gate is not None:
                    counted = True
                    self._batch_gate.expect_new(_unknown_exact(raw, keys))
                append(self._check_one(i, node, s, horizon))
                continue
            # orjson never yields NaN or inf floats, so a float here is finite.
            if (
                type(value) is not float
                or not -MAX_ABS_VALUE <= value <= MAX_ABS_VALUE
                or type(ts) is not float
                or not MIN_TIMESTAMP <= ts <= horizon
                or len(s) != (3 if labels is None else 4)
            ):
                append(self._check_one(i, node, s, horizon))
                continue
            append((key, ts, value))
        return out

    def _check_one(
        self, i: int, node: str, s: Any, horizon: float
    ) -> tuple[SeriesKey, float, float]:
        if type(s) is not dict:
            raise IngestRejected(f"samples[{i}]: must be an object, got {_short(s)}")
        value: Any = s.get("value")
        ts: Any = s.get("ts")
        tv = type(value)
        if tv is not float:
            if tv is not int:
                raise IngestRejected(_not_a_number(i, "value", s))
            value = self._int_to_float(value, f"samples[{i}].value")
        elif not math.isfinite(value):
            raise IngestRejected(f"samples[{i}].value: must be finite, got {value}")
        if not -MAX_ABS_VALUE <= value <= MAX_ABS_VALUE:
            raise IngestRejected(
                f"samples[{i}].value: {_short(value)} is outside -{MAX_ABS_VALUE:g}..{MAX_ABS_VALUE:g}"
            )
        tt = type(ts)
        if tt is not float:
            if tt is not int:
                raise IngestRejected(_not_a_number(i, "ts", s))
            ts = self._int_to_float(ts, f"samples[{i}].ts")
        if not MIN_TIMESTAMP <= ts <= horizon:
            raise IngestRejected(
                f"samples[{i}].ts: {ts!r} is negative or more than "
                f"{self.limits.max_future_skew_seconds:g} s ahead of the server clock"
            )
        return self._new_series(i, node, s), ts, value

    @staticmethod
    def _int_to_float(v: int, where: str) -> float:
        try:
            return float(v)
        except OverflowError:
            raise IngestRejected(f"{where}: {_short(v)} is too large") from None

    def _new_series(self, i: int, node: str, s: dict[str, Any]) -> SeriesKey:
        """Full checks of a sample's name, labels and fields; caches the resulting key."""
        lim = self.limits
        extra = set(s) - _SAMPLE_FIELDS
        if extra:
            raise IngestRejected(f"samples[{i}]: unknown field(s) {sorted(extra)}")
        missing = {"name", "value", "ts"} - set(s)
        if missing:
            raise IngestRejected(f"samples[{i}]: missing field(s) {sorted(missing)}")
        name = s["name"]
        if type(name) is not str or not _METRIC_NAME_RE.fullmatch(name):
            raise IngestRejected(
                f"samples[{i}].name: {_short(name)} does not match {METRIC_NAME_PATTERN}"
            )
        if len(name) > lim.max_name_length:
            raise IngestRejected(
                f"samples[{i}].name: {_short(name)} is longer than {lim.max_name_length} characters",
                kind="limit",
            )
        labels = s.get("labels", {})
        if type(labels) is not dict:
            raise IngestRejected(f"samples[{i}].labels: must be an object, got {_short(labels)}")
        if len(labels) > lim.max_labels:
            raise IngestRejected(
                f"samples[{i}].labels: {len(labels)} labels, more than the limit of "
                f"{lim.max_labels}",
                kind="limit",
            )
        for k, v in labels.items():
            if not _LABEL_NAME_RE.fullmatch(k) or len(k) > lim.max_label_name_length:
                raise IngestRejected(
                    f"samples[{i}].labels: label name {_short(k)} must match {LABEL_NAME_PATTERN} "
                    f"and be at most {lim.max_label_name_length} characters"
                )
            if type(v) is not str:
                raise IngestRejected(f"samples[{i}].labels.{k}: must be a string, got {_short(v)}")
            if "\x00" in v:
                raise IngestRejected(
                    f"samples[{i}].labels.{k}: must not contain NUL (U+0000), got {_short(v)}"
                )
            if len(v) > lim.max_label_value_length:
                raise IngestRejected(
                    f"samples[{i}].labels.{k}: value is longer than "
                    f"{lim.max_label_value_length} characters",
                    kind="limit",
                )
        key = SeriesKey.of(node, name, labels)
        if self._batch_gate is not None:
            self._batch_gate.new_series(key)
        self._cached_keys += 1
        self._cached_per_node[node] = self._cached_per_node.get(node, 0) + 1
        self._keys.setdefault(node, {})[(name, tuple(labels.items()))] = key
        return key


def _unknown_exact(
    raw: list[Any], keys: dict[tuple[str, tuple[tuple[Any, Any], ...]], SeriesKey]
) -> int:
    """How many distinct series of ``raw`` (parsed samples) ``keys`` does not know; a malformed
    sample is left to validation, which refuses it."""
    unknown = set()
    for s in raw:
        try:
            labels = s.get("labels")
            k = (s["name"], tuple(labels.items()) if labels is not None else ())
            if k not in keys:
                unknown.add(k)
        except (KeyError, TypeError, AttributeError):
            continue
    return len(unknown)


__all__ = [
    "BatchValidator",
    "IngestRejected",
    "InvalidInput",
    "ValidBatch",
    "build_models",
]
