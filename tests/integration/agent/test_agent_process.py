"""The agent process itself: kill -9 keeps the spool, SIGTERM exits in time even on a hung server."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import orjson
import pytest

from recovery.report import HeartbeatReporter
from tests.harness import AgentProcess, wait_for
from tests.integration.agent._server import OperatedServer, agent_for, committed_points

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


def spooled_points(spool: Path) -> set[tuple[str, str, float]]:
    out: set[tuple[str, str, float]] = set()
    for path in sorted((spool / "batches").glob("*.json")):
        for s in orjson.loads(path.read_bytes())["samples"]:
            out.add((s["name"], json.dumps(s["labels"], sort_keys=True), s["ts"]))
    return out


def test_agent_kill_9_keeps_its_spool_and_the_next_start_delivers_it(
    tmp_path: Path, server: OperatedServer, agents_started: list[AgentProcess]
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    HeartbeatReporter(run, "trainer", 0, job="j1").update(phase="TRAIN", step=3, force=True)
    spool = tmp_path / "spool"
    server.kill9()
    first = agent_for(server, run, spool, "--simulate-gpus", "2", "--interval", "0.2")
    agents_started.append(first)
    first.start()
    wait_for(
        lambda: len(list((spool / "batches").glob("*.json"))) >= 10, 60, "batches in the spool"
    )
    first.kill()
    on_disk = spooled_points(spool)
    assert on_disk

    server.start()
    second = agent_for(server, run, spool, "--simulate-gpus", "2", "--interval", "0.2")
    agents_started.append(second)
    second.start()
    wait_for(
        lambda: (
            (spool / "status.json").exists()
            and second.status()["batches_sent"] > 0
            and second.status()["spool_batches"] <= 1
        ),
        60,
        "the old spool to be delivered",
    )
    second.terminate()
    held = committed_points(server)  # also asserts that nothing is held twice
    missing = on_disk - held
    assert not missing, f"{len(missing)} spooled samples never arrived"


def test_sigterm_spools_the_current_round_and_exits_within_5s_on_a_hung_server(
    tmp_path: Path, agents_started: list[AgentProcess]
) -> None:
    # A server that accepts connections and never answers.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    port = hung.getsockname()[1]
    try:

        class _Fake:  # just what agent_for reads from a server
            url = f"http://127.0.0.1:{port}"
            node_token = "irrelevant-token"
            node = "n-hung"

        run = tmp_path / "run"
        run.mkdir()
        spool = tmp_path / "spool"
        agent = agent_for(_Fake(), run, spool, "--simulate-gpus", "1", "--interval", "0.5")  # type: ignore[arg-type]
        agents_started.append(agent)
        agent.start()
        wait_for(
            lambda: (spool / "status.json").exists() and agent.status()["rounds"] >= 3, 60, "rounds"
        )
        before = agent.status()
        took = agent.terminate(timeout=10)
        assert took < 5.0
        after = agent.status()
        assert after["rounds"] > before["rounds"]  # the final round was collected and spooled
        assert after["spool_batches"] == after["rounds"]  # nothing acknowledged, nothing lost
        assert len(list((spool / "batches").glob("*.json"))) == after["rounds"]
    finally:
        hung.close()
