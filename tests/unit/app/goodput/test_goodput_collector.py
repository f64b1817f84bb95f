"""``GoodputCollector``: the ledger's figures on /metrics, recomputed at most once a refresh."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from app.metrics import GoodputCollector


def test_exports_per_job_and_reuses_the_last_computation() -> None:
    calls: list[int] = []
    clock = [100.0]
    figures = [("grpo-a", 0.75, 12.5), ("grpo-b", 1.0, 0.0)]

    def compute() -> list[tuple[str, float, float]]:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("database away")
        return list(figures)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(GoodputCollector(compute, refresh_seconds=60, clock=lambda: clock[0]))
    text = generate_latest(registry).decode()
    assert 'rlguard_job_ettr_ratio{job="grpo-a"} 0.75' in text
    assert 'rlguard_job_gpu_hours_lost_total{job="grpo-a"} 12.5' in text
    assert 'rlguard_job_ettr_ratio{job="grpo-b"} 1.0' in text
    assert "# TYPE rlguard_job_gpu_hours_lost_total counter" in text
    generate_latest(registry)
    assert len(calls) == 1  # within the refresh: no new computation
    clock[0] += 61
    text = generate_latest(registry).decode()
    assert len(calls) == 2 and 'rlguard_job_ettr_ratio{job="grpo-a"} 0.75' in text  # kept
