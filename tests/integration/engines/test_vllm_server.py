"""The one vLLM launcher against a real engine: its process tree, a seeded completion with
logprobs, and a stop that leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from integrations.vllm.server import (
    ENGINE_CORE_TITLE,
    WORKER_TITLE_PREFIX,
    EngineError,
    EngineSettings,
    EngineStartError,
    VLLMServer,
    find_engine_tree,
    start_server,
)
from tests.harness.reaper import spawn
from tests.harness.vllm_engines import start_engine, stop_engine

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def _complete(server: VLLMServer, seed: int) -> dict:
    body = {
        "model": server.model_name,
        "prompt": "1+2=",
        "max_tokens": 12,
        "logprobs": 1,
        "seed": seed,
        "temperature": 1.0,
    }
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_tree_has_every_level(vllm_engine: VLLMServer) -> None:
    tree = vllm_engine.tree()
    assert tree.api_server == vllm_engine.pid
    assert tree.engine_core is not None and tree.workers
    assert len(set(tree.pids())) == len(tree.pids()) == 2 + len(tree.workers)
    assert psutil.Process(tree.engine_core).cmdline()[0] == ENGINE_CORE_TITLE
    assert psutil.Process(tree.engine_core).ppid() == tree.api_server
    for pid in tree.workers:
        assert psutil.Process(pid).cmdline()[0].startswith(WORKER_TITLE_PREFIX)
        assert psutil.Process(pid).ppid() == tree.engine_core


def test_seeded_completion_with_logprobs_repeats(vllm_engine: VLLMServer) -> None:
    first, again, other = (_complete(vllm_engine, s) for s in (7, 7, 8))
    assert first["text"] == again["text"]
    assert first["logprobs"]["token_logprobs"] == again["logprobs"]["token_logprobs"]
    assert len(first["logprobs"]["token_logprobs"]) == 12
    assert all(lp <= 0.0 for lp in first["logprobs"]["token_logprobs"])
    assert other["text"] != first["text"]


def test_dev_mode_endpoints_are_served(vllm_engine: VLLMServer) -> None:
    paused = httpx.get(f"{vllm_engine.url}/is_paused", timeout=10)
    assert paused.status_code == 200 and paused.json() == {"is_paused": False}


def test_stop_leaves_no_process(tiny_model: Path, tmp_path: Path) -> None:
    server = start_engine(tiny_model, tmp_path, warm=False)
    members = [psutil.Process(pid) for pid in server.tree().pids()]
    stop_engine(server)
    assert not [p.pid for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(EngineError, match=str(server.pid)):
        find_engine_tree(server.pid)
    server.stop()  # idempotent


def test_a_server_that_exits_while_starting_says_why(tiny_model: Path, tmp_path: Path) -> None:
    settings = EngineSettings(extra_args=("--max-model-len", "not-a-number"))
    server = start_server(tiny_model, settings=settings, log_path=tmp_path / "log", popen=spawn)
    try:
        with pytest.raises(EngineStartError, match="exited with") as caught:
            server.wait_healthy(120)
        assert "not-a-number" in str(caught.value)
    finally:
        stop_engine(server)


def test_not_a_model_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match=str(tmp_path)):
        start_server(tmp_path)


@pytest.mark.parametrize(("field", "value"), [("kv_cache_gib", 0), ("max_model_len", 0)])
def test_bad_settings_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=f"{field}={value}"):
        EngineSettings(**{field: value})
