"""An engine's process tree watched from its node: a real process listening on the engine's
port is found as its root, its death is reported at once (rollout_engine_process_dead), and a
new process on the port (the engine restarted) starts a new watch with its own uptime."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from agents.collectors.engine_processes import EngineProcessWatch, is_local, listener_pid
from agents.collectors.engines import EngineCollector, EngineSpec
from recovery.protocol.samples import Sample
from tests.harness import free_port, kill_group, spawn, wait_for


def _serve(port: int) -> Any:
    return spawn([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"])


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()


def _by_name(samples: list[Sample]) -> dict[tuple[str, str | None], float]:
    return {(s["name"], s["labels"].get("process")): s["value"] for s in samples}


def test_the_root_is_found_by_its_port_and_its_death_seen_at_once(port: int) -> None:
    server = _serve(port)
    wait_for(lambda: listener_pid(port) == server.pid, 30, "the server to listen")
    collector = EngineCollector(
        [EngineSpec.parse(f"sglang=http://127.0.0.1:{port},rank=2")], default_job="job-a"
    )
    try:
        first = _by_name(collector.collect())
        assert first[("rollout_engine_process_dead", "api_server")] == 0
        assert first[("rollout_engine_uptime_seconds", None)] >= 0
        assert first[("rollout_engine_up", None)] == 0  # http.server has no /health: 404
        kill_group(server, signal.SIGKILL)
        after = _by_name(collector.collect())
        assert after[("rollout_engine_process_dead", "api_server")] == 1
        assert ("rollout_engine_uptime_seconds", None) not in after
        replacement = _serve(port)  # the engine restarted on its port
        try:
            wait_for(lambda: listener_pid(port) == replacement.pid, 30, "the new server")
            wait_for(
                lambda: (
                    _by_name(collector.collect())[("rollout_engine_process_dead", "api_server")]
                    == 0
                ),
                10,
                "the new process tree to be watched",
            )
        finally:
            kill_group(replacement, signal.SIGKILL)
    finally:
        collector.close()


def test_an_explicit_pid_is_watched_without_a_port_lookup(port: int) -> None:
    server = _serve(port)
    watch = EngineProcessWatch(kind="sglang", port=None, pid=server.pid)
    try:
        view = watch.observe()
        assert view is not None and view.dead == {"api_server": False}
        assert view.started_at is not None
    finally:
        kill_group(server, signal.SIGKILL)
    view = watch.observe()
    assert view is not None and view.dead == {"api_server": True} and view.started_at is None


def test_a_remote_engine_is_not_watched() -> None:
    assert not is_local("engine-host.example")
    assert is_local("127.0.0.1")
    watch = EngineProcessWatch(kind="vllm", port=8000, local=False)
    assert watch.observe() is None
