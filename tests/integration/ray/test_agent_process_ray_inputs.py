"""The real agent process with bad Ray inputs: an unreachable Ray address and an unknown preset
are each said once in its log, and the agent keeps running its other collectors (its recorded
batches keep coming, with ray_collector_up 0 for the unreachable Ray)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.harness import free_port, refusing_port, spawn, wait_for
from tests.integration.ray._ray import env_for_subprocess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _agent(tmp_path: Path, *ray_args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    run, record, log = tmp_path / "run", tmp_path / "batches.jsonl", tmp_path / "agent.log"
    run.mkdir()
    with open(log, "wb") as out:
        proc = spawn(
            [
                sys.executable,
                "-m",
                "agents",
                "--server",
                f"http://127.0.0.1:{free_port()}",
                "--token",
                "t",
                "--node",
                "n1",
                "--run-dir",
                str(run),
                "--interval",
                "0.2",
                "--simulate-gpus",
                "1",
                "--spool-dir",
                str(tmp_path / "spool"),
                "--record",
                str(record),
                "--log-level",
                "WARNING",
                *ray_args,
            ],
            env=env_for_subprocess(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, record, log


def _batches(record: Path) -> list[dict]:
    if not record.exists():
        return []
    return [orjson.loads(line) for line in record.read_bytes().splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--ray", "http://127.0.0.1:{port}"), "did not answer"),
        (("--ray", "auto", "--ray-preset", "deepspeed"), "unknown Ray preset 'deepspeed'"),
    ],
)
def test_the_agent_says_it_once_and_keeps_running(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    with refusing_port() as port:  # "did not answer" must stay true for the whole test
        _says_it_once_and_keeps_running(tmp_path, tuple(a.format(port=port) for a in args), said)


def _says_it_once_and_keeps_running(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    proc, record, log = _agent(tmp_path, *args)
    polls_ray = "--ray-preset" not in args  # an unknown preset: no Ray collector at all

    def rounds() -> list[dict] | None:
        # Ten rounds, the newest after the Ray collector's first read (until then it says
        # nothing of Ray: importing its state API takes seconds on a busy machine).
        b = _batches(record)
        if len(b) < 10:
            return None
        ray_said = not polls_ray or any(s["name"] == "ray_collector_up" for s in b[-1]["samples"])
        return b if ray_said else None

    try:
        batches = wait_for(rounds, 40, "ten rounds recorded")
        assert proc.poll() is None, log.read_text()
        names = {s["name"] for s in batches[-1]["samples"]}
        assert "gpu_utilization_ratio" in names  # the other collectors go on
        text = log.read_text()
        assert text.count(said) == 1, text
        if polls_ray:
            up = [s["value"] for s in batches[-1]["samples"] if s["name"] == "ray_collector_up"]
            assert up == [0.0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
