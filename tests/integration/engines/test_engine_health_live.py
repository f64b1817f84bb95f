"""Engine health against a real vLLM engine, the real agent and the real server (PostgreSQL,
a Redis of the test's own): kill -9 of the Worker, of the EngineCore and of the API server is
``rollout_engine_dead`` within 2 s; SIGSTOP of the engine is ``rollout_engine_hung``; vLLM's own
``/pause`` with requests in flight is ``rollout_engine_wedged``; a healthy engine under load, then
idle, opens nothing.

Every engine of the module serves on one port, so the one agent watches each in turn: a new
engine on the port is a new process tree to it, as an engine its job restarted would be.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from integrations.vllm.server import EngineError, VLLMServer, free_port
from tests.harness.reaper import kill_group
from tests.harness.services import RedisServer, create_database, drop_database
from tests.harness.stack import JOB, Stack, fast_policy
from tests.harness.vllm_engines import start_engine, stop_engine

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ENGINE_KINDS = {
    "rollout_engine_dead",
    "rollout_engine_hung",
    "rollout_engine_wedged",
    "rollout_engine_down",
    "rollout_engine_requests_failing",
    "rollout_engine_preemption_storm",
}
HUNG_SECONDS = 10.0  # detection.engine.hung_seconds (policy.yaml)
WEDGED_SECONDS = 30.0  # detection.engine.wedged_seconds


class Engines:
    """The module's stack and its engines, one at a time on one port."""

    def __init__(self, stack: Stack, model: Path, tmp: Path) -> None:
        self.stack = stack
        self.model = model
        self.tmp = tmp
        self.port = free_port()
        self.current: VLLMServer | None = None
        self.seen: set[int] = set()  # incident ids already judged

    def start(self) -> VLLMServer:
        if self.current is not None:
            self.stop()
        log_dir = self.tmp / f"engine-{len(self.seen)}-{time.monotonic_ns()}"
        log_dir.mkdir()
        self.current = start_engine(self.model, log_dir, port=self.port)
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            for pid in _pids(self.current):
                with _gone():
                    os.kill(pid, signal.SIGCONT)
            stop_engine(self.current)
            # and whatever of a killed tree outlived its API server (it may hold the port)
            kill_group(self.current.process)
            self.current = None

    def engine_incidents(self) -> list[dict[str, Any]]:
        return [i for i in self.stack.incidents() if i["kind"] in ENGINE_KINDS]

    def new_incident(self, kind: str, timeout: float) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for inc in self.engine_incidents():
                if inc["kind"] == kind and inc["id"] not in self.seen:
                    return inc
            return None

        inc = self.stack.wait(found, timeout, f"a new {kind} incident")
        self.seen.add(inc["id"])
        return inc

    def quiet(self) -> None:
        """Every engine incident so far resolved (the next fault must open a new one)."""
        self.stack.wait(
            lambda: all(i["status"] == "resolved" for i in self.engine_incidents()),
            60,
            "the earlier engine incidents to resolve",
        )
        self.seen.update(i["id"] for i in self.engine_incidents())


class _gone:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is ProcessLookupError


def _pids(server: VLLMServer) -> list[int]:
    try:
        return server.tree().pids()
    except EngineError:  # the tree is gone already
        return []


def _opened(inc: dict[str, Any]) -> float:
    return datetime.fromisoformat(inc["opened_at"]).timestamp()


@pytest.fixture(scope="module")
def engines(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    tmp = tmp_path_factory.mktemp("engine-health")
    url = create_database()
    redis = RedisServer(tmp / "redis").start()
    (tmp / "stack").mkdir()
    stack = Stack(
        tmp / "stack", database_url=url, redis=redis, policy=fast_policy(tmp / "policy.yaml")
    )
    holder = Engines(stack, tiny_model, tmp)
    try:
        stack.start_server()
        holder.start()
        stack.start_agent(
            "n1",
            stack.run_dir(),
            extra=("--engine", f"vllm=http://127.0.0.1:{holder.port},job={JOB},rank=0"),
        )
        yield holder
    finally:
        holder.stop()
        stack.close()
        redis.stop()
        drop_database(url)


def _load(server: VLLMServer, stop: threading.Event, max_tokens: int = 64) -> None:
    body = {"model": server.model_name, "prompt": "1+2=", "max_tokens": max_tokens, "seed": 1}
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            try:
                client.post(f"{server.url}/v1/completions", json=body)
            except httpx.HTTPError:
                return  # the engine went away under the test: its fault, not the load's


def _running(server: VLLMServer) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running{")
    )


def test_a_healthy_engine_under_load_then_idle_opens_nothing(engines: Engines) -> None:
    server = engines.current
    assert server is not None
    stop = threading.Event()
    clients = [threading.Thread(target=_load, args=(server, stop)) for _ in range(4)]
    for c in clients:
        c.start()
    try:
        engines.stack.wait(lambda: _running(server) > 0, 30, "requests running")
        # under load for longer than the wedged window, then idle for as long
        deadline = time.monotonic() + WEDGED_SECONDS + 10
        engines.stack.wait(
            lambda: time.monotonic() > deadline or engines.engine_incidents(),
            WEDGED_SECONDS + 20,
            "the load window to pass",
        )
    finally:
        stop.set()
        for c in clients:
            c.join(120)
    deadline = time.monotonic() + WEDGED_SECONDS + 10
    engines.stack.wait(
        lambda: time.monotonic() > deadline or engines.engine_incidents(),
        WEDGED_SECONDS + 20,
        "the idle window to pass",
    )
    assert engines.engine_incidents() == []


def test_pause_with_requests_in_flight_is_wedged(engines: Engines) -> None:
    server = engines.current
    assert server is not None
    stop = threading.Event()
    clients = [threading.Thread(target=_load, args=(server, stop, 400)) for _ in range(3)]
    for c in clients:
        c.start()
    try:
        engines.stack.wait(lambda: _running(server) > 0, 30, "requests running")
        paused = httpx.post(f"{server.url}/pause", params={"mode": "keep"}, timeout=30)
        assert paused.status_code == 200, paused.text
        t0 = time.time()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        inc = engines.new_incident("rollout_engine_wedged", WEDGED_SECONDS + 30)
        print(f"rollout_engine_wedged opened {_opened(inc) - t0:.2f} s after /pause")
        assert inc["tier"] == "medium" and inc["subject"]["rank"] == 0
        assert WEDGED_SECONDS - 2 <= _opened(inc) - t0 <= WEDGED_SECONDS + 10, _opened(inc) - t0
    finally:
        httpx.post(f"{server.url}/resume", timeout=30)
        stop.set()
        for c in clients:
            c.join(120)
    engines.quiet()


@pytest.mark.parametrize("level", ["worker", "engine_core", "api_server"])
def test_kill_9_of_any_level_is_dead_within_2_s(engines: Engines, level: str) -> None:
    server = engines.current if engines.current is not None else engines.start()
    engines.quiet()
    tree = server.tree()
    pid = {
        "worker": tree.workers[0],
        "engine_core": tree.engine_core,
        "api_server": tree.api_server,
    }[level]
    assert pid is not None
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    inc = engines.new_incident("rollout_engine_dead", 30)
    delay = _opened(inc) - killed_at
    print(f"rollout_engine_dead opened {delay:.2f} s after kill -9 of the {level}")
    assert delay <= 2.0, f"detected {delay:.2f} s after kill -9 of the {level}"
    detail = engines.stack.get(f"/api/v1/incidents/{inc['id']}", engines.stack.viewer)
    assert level in str(detail), detail
    engines.start()  # the next test's engine, on the same port


def test_sigstop_of_the_engine_is_hung(engines: Engines) -> None:
    server = engines.current if engines.current is not None else engines.start()
    engines.quiet()
    members = [psutil.Process(pid) for pid in server.tree().pids()]
    t0 = time.time()
    for p in members:
        p.suspend()
    try:
        inc = engines.new_incident("rollout_engine_hung", HUNG_SECONDS + 20)
        print(f"rollout_engine_hung opened {_opened(inc) - t0:.2f} s after SIGSTOP")
        assert HUNG_SECONDS - 1 <= _opened(inc) - t0 <= HUNG_SECONDS + 8, _opened(inc) - t0
        assert not [
            i
            for i in engines.engine_incidents()
            if i["kind"] == "rollout_engine_dead" and i["id"] not in engines.seen
        ]
    finally:
        for p in members:
            with _gone():
                p.resume()
