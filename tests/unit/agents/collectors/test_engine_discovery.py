"""Engines a job announces in its run directory (``engines/<role>-<rank>.json``): found with no
``--engine`` flag, followed to a rank's new engine, skipped with a warning when the file names
a bad value. The engines' pages are recorded text (the real-engine check is the vLLM job's
Job-page test in tests/integration/workload/test_vllm_engines.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest

from agents.collectors.engine_discovery import AnnouncedEngines
from agents.collectors.engines import EngineCollector, EngineSpec
from tests.unit.agents.collectors.expositions import VLLM_0_32


def announce(run: Path, name: str, body: object) -> None:
    (run / "engines").mkdir(parents=True, exist_ok=True)
    (run / "engines" / name).write_text(json.dumps(body))


def beat(run: Path, role: str, rank: int, job: str) -> None:
    (run / "heartbeat").mkdir(parents=True, exist_ok=True)
    (run / "heartbeat" / f"{role}-{rank}.json").write_text(json.dumps({"job": job, "step": 1}))


def test_a_run_directory_without_engines_announces_none(tmp_path: Path) -> None:
    assert AnnouncedEngines(tmp_path, "run")() == []
    (tmp_path / "engines").write_text("not a directory")
    assert AnnouncedEngines(tmp_path, "run")() == []


def test_ready_engines_are_found_with_their_participants_job(tmp_path: Path) -> None:
    announce(
        tmp_path,
        "rollout-0.json",
        {"url": "http://127.0.0.1:8301", "ready": True, "pids": {"api_server": 4242}},
    )
    announce(tmp_path, "rollout-1.json", {"url": "http://127.0.0.1:8302", "ready": False})
    announce(tmp_path, "fleet.json", {"engines": {}})  # the job's own file: not an announcement
    announce(
        tmp_path,
        "rollout-2.json",
        {"url": "http://127.0.0.1:8303", "ready": True, "engine": "sglang"},
    )
    beat(tmp_path, "rollout", 0, "grpo-7")
    found = AnnouncedEngines(tmp_path, "run-dir-name")()
    assert found == [
        EngineSpec("vllm", "http://127.0.0.1:8301", "rollout", 0, "grpo-7", pid=4242),
        EngineSpec("sglang", "http://127.0.0.1:8303", "rollout", 2, "run-dir-name"),
    ]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"url": "ftp://h:1", "ready": True}, "'ftp://h:1'"),
        ({"url": "http://h:1", "ready": True, "engine": "tgi"}, "'tgi'"),
        ({"ready": True}, "'None'"),
    ],
)
def test_a_bad_announcement_is_skipped_with_one_warning_naming_the_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, body: dict[str, object], named: str
) -> None:
    announce(tmp_path, "rollout-0.json", body)
    announce(tmp_path, "rollout-1.json", {"url": "http://h:2", "ready": True})
    discover = AnnouncedEngines(tmp_path, "run")
    with caplog.at_level(logging.WARNING, logger="rlguard.agent.engines"):
        first = discover()
        second = discover()
    assert [s.rank for s in first] == [1] and first == second
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rollout-0.json" in warnings[0] and named in warnings[0]


def test_a_file_being_rewritten_is_read_again_next_round(tmp_path: Path) -> None:
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "rollout-0.json").write_text('{"url": "http://h:1", "rea')
    discover = AnnouncedEngines(tmp_path, "run")
    assert discover() == []
    announce(tmp_path, "rollout-0.json", {"url": "http://h:1", "ready": True})
    assert [s.url for s in discover()] == ["http://h:1"]


def test_the_collector_follows_a_rank_to_its_new_engine(tmp_path: Path) -> None:
    """The old engine stops being probed when the announcement names its successor; an
    --engine flag for the same participant wins over an announcement."""
    probed: list[str] = []

    def engines(request: httpx.Request) -> httpx.Response:
        probed.append(f"{request.url.host}:{request.url.port}{request.url.path}")
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, text=VLLM_0_32)

    beat(tmp_path, "rollout", 1, "grpo-7")
    announce(tmp_path, "rollout-1.json", {"url": "http://e1:8301", "ready": True})
    announce(tmp_path, "rollout-0.json", {"url": "http://announced:9000", "ready": True})
    fixed = EngineSpec.parse("vllm=http://flag:8000,role=rollout,rank=0,job=run")
    collector = EngineCollector(
        [fixed],
        default_job="run",
        transport=httpx.MockTransport(engines),
        discover=AnnouncedEngines(tmp_path, "run"),
    )
    try:
        samples = collector.collect()
        assert {p.split("/")[0] for p in probed} == {"flag:8000", "e1:8301"}
        up = {
            (s["labels"]["rank"], s["labels"]["job"])
            for s in samples
            if s["name"] == "rollout_engine_up" and s["value"] == 1
        }
        assert up == {("0", "run"), ("1", "grpo-7")}

        probed.clear()
        announce(tmp_path, "rollout-1.json", {"url": "http://e1-next:8302", "ready": True})
        collector.collect()
        assert {p.split("/")[0] for p in probed} == {"flag:8000", "e1-next:8302"}
    finally:
        collector.close()
