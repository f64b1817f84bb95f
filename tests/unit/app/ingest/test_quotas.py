"""Per-node quotas (app/ingest/quotas.py): each limit refuses a whole batch and counts nothing
of it; what leaves the window (series dropped, participants unreported) frees its place."""

from __future__ import annotations

import time

import orjson
import pytest
from prometheus_client import CollectorRegistry

from app.core.config import IngestLimits, NodeQuotaSettings
from app.core.server_metrics import ServerMetrics
from app.ingest import validation
from app.ingest.quotas import NewSeriesRateExceeded, NodeQuotas, Quota, QuotaExceeded
from app.ingest.validation import BatchValidator, ValidBatch
from app.series.store import SeriesKey, SeriesStore
from recovery.protocol.samples import ParticipantReport


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(clock: FakeClock | None = None, **limits: float) -> tuple[NodeQuotas, ServerMetrics]:
    metrics = ServerMetrics(CollectorRegistry())
    quotas = NodeQuotas(
        NodeQuotaSettings(**limits),  # type: ignore[arg-type]
        refusals=metrics.ingest_quota_refusals,
        clock=clock or FakeClock(),
    )
    return quotas, metrics


def batch(
    node: str = "n1",
    gpus: range = range(2),
    name: str = "gpu_util",
    participants: list[tuple[str, str, int]] = (),  # type: ignore[assignment]
) -> ValidBatch:
    return ValidBatch(
        agent_id="a",
        node=node,
        seq=0,
        sent_at=0.0,
        samples=[(SeriesKey.of(node, name, {"gpu": str(g)}), 1.0, 0.5) for g in gpus],
        participants=[ParticipantReport(j, r, k, "TRAIN", 1, 1.0) for j, r, k in participants],
        fingerprint=None,
    )


def refused(quotas: NodeQuotas, metrics: ServerMetrics, node: str, quota: Quota) -> float:
    value = metrics.registry.get_sample_value(
        "rlguard_ingest_quota_refusals_total", {"node": node, "quota": quota.value}
    )
    return value or 0.0


def use(quotas: NodeQuotas, node: str, quota: Quota) -> float:
    return next(u.used for u in quotas.usage(node) if u.quota is quota)


def test_series_limit_refuses_the_whole_batch_and_names_the_setting() -> None:
    quotas, metrics = make(max_series=4)
    quotas.admit(batch(gpus=range(3)))
    with pytest.raises(QuotaExceeded) as exc:
        quotas.admit(batch(gpus=range(6)))
    assert exc.value.status_code == 422
    assert exc.value.quota is Quota.MAX_SERIES
    assert "node_quotas.max_series" in str(exc.value)
    assert "RLGUARD_NODE_QUOTAS__MAX_SERIES" in str(exc.value)
    assert use(quotas, "n1", Quota.MAX_SERIES) == 3  # nothing of the refused batch counted
    assert refused(quotas, metrics, "n1", Quota.MAX_SERIES) == 1
    quotas.admit(batch(gpus=range(4)))  # exactly at the limit passes
    quotas.admit(batch("n2", gpus=range(4)))  # another node has its own quota


def test_dropped_series_free_their_place() -> None:
    store = SeriesStore(window_seconds=10)
    quotas, _ = make(max_series=2)
    store.on_forget(quotas.forget_series)
    b = batch(gpus=range(2))
    quotas.admit(b)
    store.extend(b.samples)
    with pytest.raises(QuotaExceeded):
        quotas.admit(batch(gpus=range(2, 4)))
    quotas.admit(b)  # known series: the fast path remembers this batch's keys
    quotas.admit(b)
    assert store.drop_older_than(5.0) == 2
    quotas.admit(batch(gpus=range(2, 4)))
    assert use(quotas, "n1", Quota.MAX_SERIES) == 2
    # The remembered batch's series were forgotten: they are new again, and over the limit.
    with pytest.raises(QuotaExceeded):
        quotas.admit(b)


def test_label_values_per_metric_name() -> None:
    quotas, metrics = make(max_label_values=3)
    quotas.admit(batch(gpus=range(3)))
    quotas.admit(batch(gpus=range(3), name="gpu_temp"))  # another name: its own values
    with pytest.raises(QuotaExceeded) as exc:
        quotas.admit(batch(gpus=range(2, 5)))
    assert exc.value.quota is Quota.MAX_LABEL_VALUES
    assert "gpu_util{gpu}" in str(exc.value) and "node_quotas.max_label_values" in str(exc.value)
    assert use(quotas, "n1", Quota.MAX_LABEL_VALUES) == 3
    assert refused(quotas, metrics, "n1", Quota.MAX_LABEL_VALUES) == 1


def test_jobs_and_participants_expire_after_the_window() -> None:
    clock = FakeClock()
    quotas, _ = make(clock, max_jobs=2, max_participants=3, participant_window_seconds=60)
    quotas.admit(batch(participants=[("j1", "trainer", 0), ("j2", "trainer", 0)]))
    with pytest.raises(QuotaExceeded) as exc:
        quotas.admit(batch(participants=[("j3", "trainer", 0)]))
    assert exc.value.quota is Quota.MAX_JOBS and "node_quotas.max_jobs" in str(exc.value)
    quotas.admit(batch(participants=[("j1", "rollout", 0)]))
    with pytest.raises(QuotaExceeded) as exc:
        quotas.admit(batch(participants=[("j1", "rollout", 1)]))
    assert exc.value.quota is Quota.MAX_PARTICIPANTS
    assert use(quotas, "n1", Quota.MAX_PARTICIPANTS) == 3
    clock.now += 30
    quotas.admit(batch(participants=[("j1", "trainer", 0)]))  # reported again: kept
    clock.now += 45  # j2 and j1/rollout unreported for 75 s
    quotas.admit(batch(participants=[("j3", "trainer", 0), ("j3", "rollout", 0)]))
    assert use(quotas, "n1", Quota.MAX_JOBS) == 2
    assert use(quotas, "n1", Quota.MAX_PARTICIPANTS) == 3


def test_new_series_rate_answers_429_with_retry_after() -> None:
    clock = FakeClock()
    quotas, metrics = make(clock, new_series_per_second=10, new_series_burst=20)
    quotas.admit(batch(gpus=range(15)))
    with pytest.raises(NewSeriesRateExceeded) as exc:
        quotas.admit(batch(gpus=range(15, 30)))
    assert exc.value.status_code == 429 and exc.value.retry_after == 1
    assert "node_quotas.new_series_per_second" in str(exc.value)
    assert use(quotas, "n1", Quota.MAX_SERIES) == 15
    quotas.admit(batch(gpus=range(15)))  # known series cost nothing
    clock.now += 1.0
    quotas.admit(batch(gpus=range(15, 30)))
    with pytest.raises(QuotaExceeded) as burst:
        quotas.admit(batch(gpus=range(100, 121)))  # more than the bucket ever holds
    assert burst.value.status_code == 422 and burst.value.quota is Quota.NEW_SERIES_BURST
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_PER_SECOND) == 1
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_BURST) == 1


def flood_body(node: str, names: range) -> bytes:
    now = time.time()
    samples = [{"name": f"m{i}", "value": 1.0, "ts": now, "labels": {"gpu": "0"}} for i in names]
    return orjson.dumps(
        {"agent_id": "a", "node": node, "seq": 1, "sent_at": now, "samples": samples}
    )


def test_validation_stops_at_the_first_new_series_the_node_may_not_create() -> None:
    quotas, metrics = make(max_series=100, new_series_burst=50)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    quotas.admit(validator.validate(flood_body("n1", range(40)), token_node="n1"))
    with pytest.raises(QuotaExceeded) as exc:
        validator.validate(flood_body("n1", range(1000, 6000)), token_node="n1")
    assert exc.value.status_code == 429  # 10 left of the budget, the 11th new series refuses
    assert "at least" not in str(exc.value) and "11 new series now" in str(exc.value)
    # Only what was validated before the refusal is cached, not 5,000 series.
    assert len(validator._keys["n1"]) <= 40 + 11  # noqa: SLF001
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_PER_SECOND) == 1
    # A body naming another node than the token's is not charged to that node (it gets 403).
    validator.validate(flood_body("n2", range(60)), token_node="n1")
    assert refused(quotas, metrics, "n2", Quota.MAX_SERIES) == 0


def test_validation_stops_at_the_series_limit() -> None:
    quotas, _ = make(max_series=50, new_series_burst=1000)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    quotas.admit(validator.validate(flood_body("n1", range(40)), token_node="n1"))
    with pytest.raises(QuotaExceeded) as exc:
        validator.validate(flood_body("n1", range(2000, 7000)), token_node="n1")
    assert exc.value.quota is Quota.MAX_SERIES and exc.value.status_code == 422
    assert "at least 11 new series would make 51" in str(exc.value)


def gpu_body(node: str, gpus: range, participants: int = 0) -> bytes:
    now = time.time()
    samples = [
        {"name": "gpu_util", "value": 1.0, "ts": now, "labels": {"gpu": str(g)}} for g in gpus
    ]
    parts = [
        {"job": f"j{r}", "role": "trainer", "rank": r, "phase": "TRAIN", "step": 1, "ts": now}
        for r in range(participants)
    ]
    return orjson.dumps(
        {
            "agent_id": "a",
            "node": node,
            "seq": 1,
            "sent_at": now,
            "samples": samples,
            "participants": parts,
        }
    )


def test_validation_stops_at_the_first_label_value_too_many_with_the_budget_full() -> None:
    # A flooder keeping its creation budget full and failing another check must not make the
    # server validate all its new series each time.
    quotas, metrics = make(max_label_values=16)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    quotas.admit(validator.validate(gpu_body("n1", range(8)), token_node="n1"))
    with pytest.raises(QuotaExceeded) as exc:
        validator.validate(gpu_body("n1", range(100, 4100)), token_node="n1")
    assert exc.value.quota is Quota.MAX_LABEL_VALUES and "17 distinct values" in str(exc.value)
    assert len(validator._keys["n1"]) <= 8 + 9  # noqa: SLF001 - only those checked before it
    assert refused(quotas, metrics, "n1", Quota.MAX_LABEL_VALUES) == 1


def test_validation_refuses_too_many_jobs_before_any_sample() -> None:
    quotas, metrics = make(max_jobs=4)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    quotas.admit(validator.validate(gpu_body("n1", range(2), participants=2), token_node="n1"))
    with pytest.raises(QuotaExceeded) as exc:
        validator.validate(gpu_body("n1", range(100, 5100), participants=5), token_node="n1")
    assert exc.value.quota is Quota.MAX_JOBS
    assert len(validator._keys["n1"]) == 2  # noqa: SLF001 - no sample of it was validated
    assert refused(quotas, metrics, "n1", Quota.MAX_JOBS) == 1


def test_more_unknown_series_than_the_budget_is_a_retry_before_any_is_validated() -> None:
    quotas, metrics = make(new_series_burst=1000, new_series_per_second=10)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    quotas.admit(validator.validate(flood_body("n1", range(900)), token_node="n1"))
    with pytest.raises(NewSeriesRateExceeded) as exc:  # 100 left, 500 unknown
        validator.validate(flood_body("n1", range(1000, 1500)), token_node="n1")
    assert "500 new series now, with 100 left" in str(exc.value)
    assert exc.value.retry_after == 40
    assert len(validator._keys["n1"]) == 900  # noqa: SLF001 - none of them validated
    assert refused(quotas, metrics, "n1", Quota.NEW_SERIES_PER_SECOND) == 1


def test_the_cache_keeps_the_series_the_node_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A cache miss must mean a new series: emptying the cache of a node's known series would
    # make its next ordinary batch look like 60 new ones, more than its budget (a false 429).
    monkeypatch.setattr(validation, "_KEY_CACHE_LIMIT_PER_NODE", 50)
    quotas, _ = make(new_series_burst=100, new_series_per_second=0.001, max_label_values=3)
    validator = BatchValidator(IngestLimits())
    validator.gate = quotas
    ordinary = flood_body("n1", range(60))
    quotas.admit(validator.validate(ordinary, token_node="n1"))  # 40 of the budget left
    for start in range(1000, 1400, 10):  # validated, then refused: they fill the cache
        with pytest.raises(QuotaExceeded) as exc:
            validator.validate(gpu_body("n1", range(start, start + 10)), token_node="n1")
        assert exc.value.quota is Quota.MAX_LABEL_VALUES
    assert len(validator._keys["n1"]) < 60 + 50  # noqa: SLF001 - the cache was trimmed
    quotas.admit(validator.validate(ordinary, token_node="n1"))  # not taken for new series
