"""Real vLLM engines for tests: the tiny model built once per session and servers started with
the one launcher (:mod:`integrations.vllm.server`) through the reaper, so that no engine
process outlives the pytest run, whatever kills it.

A test module shares one engine (starting one takes 20-60 s here): see the ``vllm_engine``
fixture in ``tests/integration/engines/conftest.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from integrations.vllm.server import (
    EngineError,
    EngineSettings,
    VLLMServer,
    find_engine_tree,
    start_server,
)
from integrations.vllm.tiny_model import save_tiny_model
from tests.harness.reaper import forget, spawn
from workload.engines import records
from workload.job import RunDir, read_events

# Start-up here is 20-60 s (more on a loaded machine); the first request after it pays one-off
# costs of its own.
START_TIMEOUT = 240.0


def tiny_model_dir(root: Path) -> Path:
    """The tiny model, built under ``root`` once (a complete one is reused)."""
    return save_tiny_model(root / "tiny-qwen2")


def start_engine(
    model_dir: Path,
    log_dir: Path,
    settings: EngineSettings | None = None,
    *,
    warm: bool = True,
    port: int | None = None,
) -> VLLMServer:
    """A vLLM server for ``model_dir`` (on ``port``, default a free one), healthy and
    (``warm``) past its first request."""
    server = start_server(
        model_dir, settings=settings, port=port, log_path=log_dir / "vllm.log", popen=spawn
    )
    try:
        server.wait_healthy(START_TIMEOUT)
        if warm:
            server.warm_up()
    except BaseException:
        stop_engine(server)
        raise
    return server


def stop_engine(server: VLLMServer) -> None:
    """Stop the whole tree and tell the reaper its group is gone."""
    server.stop()
    forget(server.process)


def kill_job_engines(run: RunDir, ranks: int) -> None:
    """Whatever engine processes a reference job's run left, its standby's too: they run in
    sessions of their own, out of reach of the launcher's process group."""
    for rank in range(ranks):
        record = records.read_record(run, rank)
        if record is not None:
            records.kill_leftovers(record, spare={os.getpid()})
    for e in read_events(run):
        if e["kind"] == "standby_ready" and e.get("engine"):
            try:
                pids = find_engine_tree(int(e["api_server"])).pids()
            except EngineError:
                continue
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
