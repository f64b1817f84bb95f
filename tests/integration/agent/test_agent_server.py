"""The agent against the real server: delivery, a server kill -9 mid-run, the spool limit."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from recovery.report import HeartbeatReporter
from tests.harness import RLGUARD, AgentProcess, wait_for
from tests.integration.agent._server import OperatedServer, agent_for, committed_points

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(180)]


def make_run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "grpo-run"
    run.mkdir()
    HeartbeatReporter(run, "rollout", 0, job="grpo-it").update(
        phase="ROLLOUT", tokens=1000, pending=3, scheduled=10, state_log_latency_ms=7.5, force=True
    )
    HeartbeatReporter(run, "trainer", 0, job="grpo-it").update(phase="TRAIN", step=12, force=True)
    return run


def test_samples_show_in_series_api_and_metrics(
    tmp_path: Path, server: OperatedServer, agents_started: list[AgentProcess]
) -> None:
    run = make_run_dir(tmp_path)
    agent = agent_for(server, run, tmp_path / "spool", "--simulate-gpus", "2", "--interval", "0.5")
    agents_started.append(agent)
    agent.start()
    wait_for(
        lambda: any(s["points"] for s in server.series("gpu_utilization_ratio")), 60, "GPU samples"
    )
    wait_for(lambda: server.series("rollout_pending_ratio"), 30, "job samples")

    gpu = server.series("gpu_temperature_celsius")
    assert {s["labels"]["gpu"] for s in gpu} == {"0", "1"}
    assert all(s["labels"]["simulated"] == "1" for s in gpu)
    [ratio] = server.series("rollout_pending_ratio")
    assert ratio["labels"] == {"job": "grpo-it", "role": "rollout", "rank": "0"}
    assert ratio["points"][-1][1] == pytest.approx(0.3)
    [latency] = server.series("state_log_write_latency_ms")
    assert latency["points"][-1][1] == 7.5

    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    mine = [line for line in metrics.splitlines() if f'node="{server.node}"' in line]
    temp_lines = [line for line in mine if line.startswith("rlguard_gpu_temperature_celsius{")]
    assert len(temp_lines) == 2
    assert any(
        line.startswith("rlguard_rollout_pending_ratio{") and line.endswith(" 0.3") for line in mine
    )
    assert any(line.startswith("rlguard_train_step{") and line.endswith(" 12.0") for line in mine)

    # the operator's view: `rlguard agent --status` goes through the server CLI's pass-through
    out = subprocess.run(
        [*RLGUARD, "agent", "--node", server.node, "--spool-dir", str(agent.spool_dir), "--status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "running" in out.stdout and "last send: 20" in out.stdout
    took = agent.terminate()
    assert took < 5.0


def test_server_kill_9_and_restart_loses_nothing_and_applies_nothing_twice(
    tmp_path: Path, server: OperatedServer, agents_started: list[AgentProcess]
) -> None:
    run = make_run_dir(tmp_path)
    agent = agent_for(server, run, tmp_path / "spool", "--simulate-gpus", "2", "--interval", "0.2")
    agents_started.append(agent)
    agent.start()
    held: set[tuple[str, str, float]] = set()
    for _cycle in range(2):
        wait_for(lambda: any(s["points"] for s in server.series()), 60, "deliveries to this server")
        time.sleep(1.5)  # the scenario: deliveries keep flowing, so the freeze may land mid-way
        # Freeze the agent (possibly in the middle of a delivery), let the server finish its
        # group commit, read what it holds, then kill it.
        agent.signal(signal.SIGSTOP)
        # An in-flight batch is in the store before its commit; reading it before the commit ends
        # would count a sample the server never acknowledged (and B applies again).
        before = committed_points(server)
        assert before, "nothing arrived before the kill"
        assert not (before & held), "a sample is held by two server lifetimes"
        held |= before
        server.kill9()
        agent.signal(signal.SIGCONT)
        wait_for(lambda: agent.status()["spool_batches"] >= 5, 60, "the agent to spool")
        server.start()
    wait_for(lambda: agent.status()["spool_batches"] <= 1, 60, "the spool to drain after restart")
    agent.terminate()
    after = committed_points(server)
    assert not (after & held), "a sample was applied twice"
    held |= after
    status = agent.status()
    assert status["dropped"] == {"spool_full": 0, "rejected": 0}
    assert len(held) + status["spool_samples"] == status["produced_samples"], status


def test_spool_limit_drop_count_equals_what_is_missing(
    tmp_path: Path, server: OperatedServer, agents_started: list[AgentProcess]
) -> None:
    run = make_run_dir(tmp_path)
    server.kill9()  # down from the start: everything goes to the spool
    # 8 GPUs make ~25 KB per round, the job signals ~2 KB: the limit is hit within seconds
    # while every round's job signals still fit.
    agent = agent_for(
        server,
        run,
        tmp_path / "spool",
        "--simulate-gpus",
        "8",
        "--interval",
        "0.2",
        "--spool-max-bytes",
        "512K",
    )
    agents_started.append(agent)
    agent.start()
    wait_for(
        lambda: (
            (tmp_path / "spool" / "status.json").exists()
            and agent.status()["dropped"]["spool_full"] > 0
        ),
        60,
        "the spool limit to be hit",
    )
    time.sleep(1.0)  # the scenario: the agent keeps dropping at its limit while the server is down
    server.start()
    wait_for(lambda: agent.status()["spool_batches"] <= 1, 60, "the spool to drain")
    agent.terminate()
    held = committed_points(server)
    series = server.series()
    status = agent.status()
    dropped = status["dropped"]["spool_full"]
    assert dropped > 0 and status["dropped"]["rejected"] == 0
    assert len(held) + dropped + status["spool_samples"] == status["produced_samples"], status
    # GPU samples went first: every round's job signals survived the outage
    steps = [s for s in series if s["name"] == "train_step"]
    assert len(steps) == 1 and len(steps[0]["points"]) == status["rounds"]
    gpu = [p[0] for s in series if s["name"] == "gpu_temperature_celsius" for p in s["points"]]
    assert len(gpu) < 8 * status["rounds"]
    assert min(gpu) > min(p[0] for p in steps[0]["points"]) + 1.0  # the oldest rounds lost theirs


def test_large_batches_travel_gzipped_and_are_accepted(
    tmp_path: Path, server: OperatedServer, agents_started: list[AgentProcess]
) -> None:
    run = make_run_dir(tmp_path)
    # 48 GPUs make a body of ~150 KB, above the 64 KiB gzip threshold
    record = tmp_path / "trace.jsonl"
    agent = agent_for(
        server,
        run,
        tmp_path / "spool",
        "--simulate-gpus",
        "48",
        "--interval",
        "1",
        "--record",
        str(record),
    )
    agents_started.append(agent)
    agent.start()
    wait_for(
        lambda: (
            (tmp_path / "spool" / "status.json").exists() and agent.status()["batches_sent"] >= 2
        ),
        60,
        "two deliveries",
    )
    agent.terminate()
    gpus = {s["labels"]["gpu"] for s in server.series("gpu_temperature_celsius")}
    assert gpus == {str(i) for i in range(48)}
    status = agent.status()
    assert status["dropped"]["rejected"] == 0
    assert "refused a gzip body" not in agent.log_path.read_text()
    assert min(len(line) for line in record.read_text().splitlines()) > 64 * 1024  # gzip was due
