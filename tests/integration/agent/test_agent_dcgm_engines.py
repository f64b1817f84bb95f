"""The real agent process with its GPU source on dcgm-exporter and two inference engines, all
served by real local HTTP servers from recorded exposition text (dcgm-exporter 4.5.3-4.8.2,
vLLM, SGLang formats), against the real RLGuard server.

The sequence: everything answers → a GPU disappears from the exporter's page → the exporter goes
down (said once in the log, job signals keep arriving) → the vLLM engine goes down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from recovery.report import HeartbeatReporter
from tests.harness import AgentProcess, wait_for
from tests.integration.agent._server import OperatedServer, agent_for
from tests.unit.agents.collectors.expositions import DCGM, SGLANG, VLLM, without_gpu

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(120)]


class PageServer:
    """A real HTTP server on 127.0.0.1 serving ``pages`` (path → text); 404 elsewhere."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = owner.pages.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Shut the server and close its socket: connections are refused from now on."""
        if self._thread.is_alive():
            self.httpd.shutdown()
            self.httpd.server_close()
            self._thread.join(5)


@pytest.fixture
def page_servers() -> Iterator[list[PageServer]]:
    started: list[PageServer] = []
    yield started
    for s in started:
        s.stop()


def latest(server: OperatedServer, name: str, **labels: str) -> tuple[float, float] | None:
    """(ts, value) of the newest point of ``name`` whose labels include ``labels``."""
    best: tuple[float, float] | None = None
    for s in server.series(name):
        if all(s["labels"].get(k) == v for k, v in labels.items()) and s["points"]:
            ts, value = s["points"][-1]
            if best is None or ts > best[0]:
                best = (ts, value)
    return best


def value_is(server: OperatedServer, name: str, value: float, **labels: str) -> bool:
    got = latest(server, name, **labels)
    return got is not None and got[1] == pytest.approx(value)


def test_agent_on_dcgm_exporter_and_two_engines(
    tmp_path: Path,
    server: OperatedServer,
    agents_started: list[AgentProcess],
    page_servers: list[PageServer],
) -> None:
    run = tmp_path / "grpo-run"
    run.mkdir()
    reporter = HeartbeatReporter(run, "trainer", 0, job="grpo-a")
    reporter.update(phase="TRAIN", step=3, force=True)
    exporter = PageServer({"/metrics": DCGM})
    vllm = PageServer({"/health": "", "/metrics": VLLM})
    sglang = PageServer({"/health": "", "/metrics": SGLANG})
    page_servers.extend([exporter, vllm, sglang])
    agent = agent_for(
        server,
        run,
        tmp_path / "spool",
        "--interval",
        "0.25",
        "--gpu-source",
        "dcgm-exporter",
        "--dcgm-url",
        exporter.url + "/metrics",
        "--engine",
        f"vllm={vllm.url},role=rollout,rank=0,job=grpo-a",
        "--engine",
        f"sglang={sglang.url},role=rollout,rank=1,job=grpo-a",
    )
    agents_started.append(agent)
    agent.start()

    wait_for(
        lambda: (
            value_is(server, "gpu_utilization_ratio", 0.35, gpu="1")
            and value_is(server, "rollout_engine_up", 1, engine="vllm", rank="0")
            and value_is(server, "rollout_engine_up", 1, engine="sglang", rank="1")
        ),
        30,
        "GPU samples from the exporter and both engines up",
    )
    assert value_is(server, "rollout_pending_ratio", 0.25, engine="vllm", job="grpo-a")
    assert value_is(server, "rollout_engine_kv_cache_usage_ratio", 0.71, engine="sglang")
    assert value_is(server, "agent_dcgm_exporter_up", 1)
    assert latest(server, "agent_nvml_available") is None

    # GPU 1 is no longer listed by the exporter: lost.
    exporter.pages["/metrics"] = without_gpu(DCGM, "1")
    wait_for(lambda: value_is(server, "gpu_lost", 1, gpu="1"), 20, "gpu_lost 1 for gpu 1")
    assert value_is(server, "gpu_lost", 0, gpu="0")

    # The exporter goes down: logged once, job signals keep coming.
    exporter.stop()
    wait_for(lambda: value_is(server, "agent_dcgm_exporter_up", 0), 20, "exporter down")
    down_at = time.time()
    reporter.update(phase="TRAIN", step=4, force=True)
    wait_for(
        lambda: (
            (got := latest(server, "train_step", job="grpo-a")) is not None
            and got[0] > down_at + 1.0
            and got[1] == 4
        ),
        20,
        "job signals after the exporter went down",
    )
    gpu_after = latest(server, "gpu_utilization_ratio", gpu="0")
    assert gpu_after is not None and gpu_after[0] < down_at  # no GPU samples while it is down

    # The vLLM engine dies; SGLang stays up.
    vllm.stop()
    wait_for(
        lambda: value_is(server, "rollout_engine_up", 0, engine="vllm"), 20, "vllm engine down"
    )
    assert value_is(server, "rollout_engine_up", 1, engine="sglang")
    agent.terminate()
    log = agent.log_path.read_text()
    assert log.count("dcgm-exporter is not answering") == 1, log[-3000:]
    assert log.count(f"engine vllm rollout-0 at {vllm.url} is not answering") == 1, log[-3000:]
    assert "is no longer listed by dcgm-exporter: lost" in log
