"""Each node's share of the ingest CPU time (app/ingest/cpu_share.py, through NodeQuotas): a node
whose batches took more than its burst and its share is refused 429 with Retry-After until the
debt is paid, refused work costs it REFUSED_FACTOR times more, and other nodes never notice."""

from __future__ import annotations

import math

import pytest

from app.ingest.cpu_share import REFUSED_FACTOR
from app.ingest.quotas import CpuShareExceeded, NodeQuotas, Quota
from tests.unit.app.ingest.test_quotas import FakeClock, make, refused


def use(quotas: NodeQuotas, node: str, quota: Quota) -> float:
    return next(u.used for u in quotas.usage(node) if u.quota is quota)


def test_a_node_within_its_burst_passes_and_one_in_debt_waits_for_its_share() -> None:
    clock = FakeClock()
    quotas, metrics = make(clock, ingest_cpu_share=0.02, ingest_cpu_burst_seconds=0.25)
    quotas.admit_request("n1")  # a node never charged: nothing to check
    quotas.charge_cpu("n1", 0.2)
    quotas.admit_request("n1")  # 50 ms of the burst left
    assert use(quotas, "n1", Quota.INGEST_CPU_BURST_SECONDS) == pytest.approx(200.0)
    quotas.charge_cpu("n1", 0.09)  # 40 ms in debt: 2 s at 2% of a core
    with pytest.raises(CpuShareExceeded) as exc:
        quotas.admit_request("n1")
    assert exc.value.status_code == 429 and exc.value.retry_after == 2
    text = str(exc.value)
    assert "node_quotas.ingest_cpu_share = 0.02" in text
    assert "RLGUARD_NODE_QUOTAS__INGEST_CPU_SHARE" in text
    assert "RLGUARD_NODE_QUOTAS__INGEST_CPU_BURST_SECONDS" in text
    assert "the body was not read; retry in 2 s" in text
    assert refused(quotas, metrics, "n1", Quota.INGEST_CPU_SHARE) == 1
    quotas.admit_request("n2")  # another node has its own share
    quotas.charge_cpu("n2", 0.01)
    quotas.admit_request("n2")
    clock.now += 1.0  # 20 ms earned back: still 20 ms in debt
    with pytest.raises(CpuShareExceeded) as again:
        quotas.admit_request("n1")
    assert again.value.retry_after == 1
    clock.now += 1.0
    quotas.admit_request("n1")  # the debt is paid
    assert refused(quotas, metrics, "n1", Quota.INGEST_CPU_SHARE) == 2
    # The bucket refills to its burst, never beyond.
    clock.now += 3600
    assert use(quotas, "n1", Quota.INGEST_CPU_BURST_SECONDS) == 0.0


def test_refused_work_costs_the_node_more() -> None:
    clock = FakeClock()
    quotas, _ = make(clock, ingest_cpu_share=0.01, ingest_cpu_burst_seconds=0.1)
    quotas.charge_cpu("n1", 0.02, refused=True)
    quotas.charge_cpu("n2", 0.02)
    spent = use(quotas, "n1", Quota.INGEST_CPU_BURST_SECONDS)
    assert spent == pytest.approx(20.0 * REFUSED_FACTOR)
    assert use(quotas, "n2", Quota.INGEST_CPU_BURST_SECONDS) == pytest.approx(20.0)
    quotas.charge_cpu("n1", 0.02, refused=True)  # in debt by 0.16 - 0.1 s
    with pytest.raises(CpuShareExceeded) as exc:
        quotas.admit_request("n1")
    assert exc.value.retry_after == math.ceil((0.04 * REFUSED_FACTOR - 0.1) / 0.01)
    quotas.admit_request("n2")


def test_the_share_is_a_row_of_the_node_page() -> None:
    from app.views.models.node_quotas import quota_rows

    quotas, _ = make(ingest_cpu_share=0.02, ingest_cpu_burst_seconds=0.25)
    quotas.charge_cpu("n1", 0.3)
    with pytest.raises(CpuShareExceeded):
        quotas.admit_request("n1")
    rows = {r.env: r for r in quota_rows(quotas, "n1")}
    budget = rows["RLGUARD_NODE_QUOTAS__INGEST_CPU_BURST_SECONDS"]
    assert budget.used == pytest.approx(300.0) and budget.limit == 250.0 and budget.level == "warn"
    share = rows["RLGUARD_NODE_QUOTAS__INGEST_CPU_SHARE"]
    assert share.used is None and share.refused == 1 and share.level == "bad"


def test_by_default_a_flooding_node_is_stopped_right_after_its_first_big_batch() -> None:
    # The flood benchmark's first seconds: one accepted batch of 5,000 new series (~70 ms),
    # then 5,000-sample batches refused after their decode (~10 ms each, counted 4 times).
    clock = FakeClock()
    quotas, _ = make(clock)  # the default share and burst
    quotas.admit_request("flood")
    quotas.charge_cpu("flood", 0.07)  # passes: a batch of any size passes a node out of debt
    decoded = 0
    while True:
        try:
            quotas.admit_request("flood")
        except CpuShareExceeded:
            break
        quotas.charge_cpu("flood", 0.01, refused=True)
        decoded += 1
    assert decoded == 1  # with the former 0.25 s burst: 5 more decoded on the loop at once
