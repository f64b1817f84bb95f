"""A batch of many new series is validated in slices (``BatchValidator.validate_in_slices``):
the pipeline serves other requests between them, so a fresh agent's first batch, or a flood's,
does not hold the event loop for its whole 30-100 ms of checks. Sliced or not, the answer is
the same, other batches validated between the slices change nothing, and the node's quotas
refuse the batch as early as before."""

from __future__ import annotations

import time
from collections.abc import Generator

import orjson
import pytest

from app.core.config import IngestLimits
from app.ingest.quotas import Quota, QuotaExceeded
from app.ingest.validation import NEW_SERIES_SLICE, BatchValidator, ValidBatch
from tests.unit.app.ingest.test_quotas import make, refused


def body(node: str, names: range, gpus: int = 1) -> bytes:
    now = time.time()
    samples = [
        {"name": f"m{i}", "value": float(i), "ts": now, "labels": {"gpu": str(g)}}
        for i in names
        for g in range(gpus)
    ]
    return orjson.dumps(
        {"agent_id": "a", "node": node, "seq": 1, "sent_at": now, "samples": samples}
    )


def drive(
    slices: Generator[None, None, ValidBatch], between=lambda: None
) -> tuple[ValidBatch, int]:  # noqa: ANN001
    """Run ``slices`` to its end, calling ``between`` at each yield: (batch, yields)."""
    yields = 0
    while True:
        try:
            next(slices)
        except StopIteration as done:
            return done.value, yields
        yields += 1
        between()


def test_many_new_series_are_validated_in_slices_with_the_answer_of_one_piece() -> None:
    raw = body("n1", range(500), gpus=2)  # 1,000 new series
    sliced, yields = drive(BatchValidator(IngestLimits()).validate_in_slices(raw, token_node="n1"))
    assert yields == 1000 // NEW_SERIES_SLICE - 1
    whole = BatchValidator(IngestLimits()).validate(raw, token_node="n1")
    assert sliced == whole and len(sliced.samples) == 1000


def test_known_series_and_small_batches_are_not_sliced() -> None:
    v = BatchValidator(IngestLimits())
    raw = body("n1", range(1000))
    drive(v.validate_in_slices(raw, token_node="n1"))
    assert drive(v.validate_in_slices(raw, token_node="n1"))[1] == 0  # all known now
    assert (
        drive(
            v.validate_in_slices(body("n1", range(2000, 2000 + NEW_SERIES_SLICE)), token_node="n1")
        )[1]
        == 0
    )


def test_batches_validated_between_the_slices_change_nothing() -> None:
    v = BatchValidator(IngestLimits())
    others = []
    raw = body("n1", range(1000))
    batch, yields = drive(
        v.validate_in_slices(raw, token_node="n1"),
        lambda: others.append(
            v.validate(body("n2", range(len(others) * 10, len(others) * 10 + 300)), token_node="n2")
        ),
    )
    assert yields == 3 and len(others) == 3
    assert batch == BatchValidator(IngestLimits()).validate(raw, token_node="n1")
    assert {k.node for k, _, _ in batch.samples} == {"n1"}


def test_the_quotas_refuse_a_sliced_batch_at_its_first_series_too_many() -> None:
    quotas, metrics = make(max_series=10_000, new_series_burst=600)
    v = BatchValidator(IngestLimits())
    v.gate = quotas
    slices = v.validate_in_slices(body("n1", range(1000)), token_node="n1")
    # Between the slices another node's batch is validated, with its own early checks: the
    # refusal is still counted to n1, at its 601st new series (in its third slice).
    with pytest.raises(QuotaExceeded) as exc:
        drive(slices, lambda: v.validate(body("n2", range(20)), token_node="n2"))
    assert exc.value.quota is Quota.NEW_SERIES_BURST and exc.value.status_code == 422
    assert "601 new series at once" in str(exc.value)
    assert len(v._text_keys["n1"]) == 600  # noqa: SLF001 - not the 400 after the refusal
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_BURST) == 1
    assert refused(quotas, metrics, "n2", Quota.NEW_SERIES_BURST) == 0


def test_a_batch_the_budget_cannot_pay_for_now_is_refused_before_any_slice() -> None:
    quotas, metrics = make(max_series=10_000, new_series_burst=2000)
    v = BatchValidator(IngestLimits())
    v.gate = quotas
    quotas.admit(v.validate(body("n1", range(1500)), token_node="n1"))  # 500 left of the burst
    slices = v.validate_in_slices(body("n1", range(5000, 6000)), token_node="n1")
    with pytest.raises(QuotaExceeded) as exc:
        next(slices)
    assert exc.value.status_code == 429
    refused_names = {f"m{i}" for i in range(5000, 6000)}
    assert not any(name in refused_names for name, _ in v._text_keys["n1"])  # noqa: SLF001
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_PER_SECOND) == 1
