"""The agent's Ray options: bad values end in one line (exit 2); an unknown preset is said and
the agent keeps running its other collectors; Ray's participants take verl's step."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from agents.__main__ import main
from agents.agent import Agent, AgentConfig
from agents.fake_nvml import FakeNVML
from integrations.ray.state import ActorRecord, ClusterSnapshot


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--server",
        "http://127.0.0.1:9",
        "--token",
        "tok",
        "--node",
        "n1",
        "--run-dir",
        str(tmp_path),
        "--spool-dir",
        str(tmp_path / "spool"),
        *extra,
    ]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--ray", "not an address"], "'not an address'"),
        (["--ray", "ftp://head:8265"], "'ftp://head:8265'"),
        (["--ray-job", "x"], "--ray-job: only with --ray"),
        (["--ray", "auto", "--ray-job", "-bad job"], "'-bad job'"),
    ],
)
def test_bad_ray_values_give_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(_argv(tmp_path, *extra))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "spool").exists()


def _agent(tmp_path: Path, **kw: object) -> Agent:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    cfg = AgentConfig(
        server="http://rlguard.test",
        token="t",
        node="n1",
        run_dir=run,
        spool_dir=tmp_path / "spool",
        simulate_gpus=1,
        spool_fsync=False,
        **kw,
    )  # type: ignore[arg-type]
    return Agent(cfg, nvml=FakeNVML(1), clock=lambda: 1_700_000_000.0)


def _bodies(agent: Agent) -> list[dict]:
    return [
        orjson.loads(p.read_bytes())
        for p in sorted((agent.config.spool_dir / "batches").glob("*.json"))
    ]


def test_an_unknown_preset_is_said_and_the_agent_keeps_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="rlguard.agent"):
        agent = _agent(tmp_path, ray_address="auto", ray_preset="deepspeed")
    assert agent.ray is None
    assert any("unknown Ray preset 'deepspeed'" in r.getMessage() for r in caplog.records)
    agent.nvml.start()
    agent.round()
    [body] = _bodies(agent)
    assert any(s["name"] == "gpu_utilization_ratio" for s in body["samples"])


def test_ray_participants_take_the_step_from_verls_log(tmp_path: Path) -> None:
    log = tmp_path / "verl.jsonl"
    log.write_bytes(orjson.dumps({"step": 30, "data": {"perf/throughput": 9.0}}) + b"\n")
    agent = _agent(tmp_path, ray_address="auto", ray_preset="verl", ray_job="v", verl_log=log)
    snap = ClusterSnapshot(
        actors=(
            ActorRecord(
                "a", "WorkerDict", "ALIVE", "01000000", "pWorkerDict_0:0", "n", 5, 0, None, None
            ),
        ),
        nodes=(),
        jobs=(),
    )
    agent.ray._read = lambda: snap
    assert agent.ray.poll_once()
    agent.nvml.start()
    agent.round()
    [body] = _bodies(agent)
    assert body["participants"] == [
        {
            "job": "v",
            "role": "trainer",
            "rank": 0,
            "phase": "RUNNING",
            "step": 30,
            "ts": 1_700_000_000.0,
        }
    ]
    names = {s["name"] for s in body["samples"]}
    assert {"ray_actor_alive", "ray_collector_up", "train_throughput_tokens_per_second"} <= names
