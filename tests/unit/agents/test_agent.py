"""The agent's rounds: ingest bodies in the contract's shape, chunking, fingerprint, faults, status."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import orjson
import pytest

from agents.agent import Agent, AgentConfig
from agents.fake_nvml import FakeNVML
from recovery.protocol.metric_names import ALL_METRICS
from recovery.report import HeartbeatReporter

ENVELOPE = {"agent_id", "node", "seq", "samples", "participants", "fingerprint"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def spooled(agent: Agent) -> list[dict]:
    files = sorted((agent.config.spool_dir / "batches").glob("*.json"))
    return [orjson.loads(p.read_bytes()) for p in files]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Agent, Clock, FakeNVML, Path]:
    clock = Clock()
    run = tmp_path / "run-42"
    run.mkdir()
    fake = FakeNVML(2, clock=clock)
    cfg = AgentConfig(
        server="http://rlguard.test",
        token="t",
        node="node-a",
        run_dir=run,
        spool_dir=tmp_path / "spool",
        simulate_gpus=2,
        record=tmp_path / "trace.jsonl",
        spool_fsync=False,
    )
    refuse = httpx.MockTransport(lambda r: httpx.Response(503, json={"detail": "down"}))
    agent = Agent(cfg, nvml=fake, clock=clock, transport=refuse)
    agent.nvml.start()
    return agent, clock, fake, run


def test_round_produces_one_contract_shaped_body(
    setup: tuple[Agent, Clock, FakeNVML, Path],
) -> None:
    agent, clock, _fake, run = setup
    HeartbeatReporter(run, "rollout", 0, clock=clock).update(
        phase="ROLLOUT", pending=1, scheduled=4, force=True
    )
    agent.round()
    [body] = spooled(agent)
    assert set(body) == ENVELOPE
    assert body["node"] == "node-a" and body["agent_id"] == agent.spool.agent_id
    names = {s["name"] for s in body["samples"]}
    assert names <= ALL_METRICS
    assert {"gpu_utilization_ratio", "rollout_pending_ratio", "agent_spool_batches"} <= names
    for s in body["samples"]:
        assert set(s) == {"name", "value", "ts", "labels"}
        assert isinstance(s["value"], float)
        assert all(isinstance(v, str) for v in s["labels"].values())
        if s["name"].startswith("gpu_"):
            assert s["labels"]["simulated"] == "1"
        else:
            assert "simulated" not in s["labels"]
    assert body["participants"] == [
        {
            "job": "run-42",
            "role": "rollout",
            "rank": 0,
            "phase": "ROLLOUT",
            "step": 0,
            "ts": clock.now,
        }
    ]
    fp = body["fingerprint"]
    assert fp is not None and {"python", "hash", "driver", "pkg:torch"} <= set(fp)
    assert all(isinstance(v, str) for v in fp.values())


def test_fingerprint_sent_at_start_and_again_only_when_due(
    setup: tuple[Agent, Clock, FakeNVML, Path],
) -> None:
    agent, clock, _fake, _run = setup
    for _ in range(5):
        agent.round()
        clock.now += 1
    clock.now += 400  # past the resend period
    agent.round()
    fps = [b["fingerprint"] for b in spooled(agent)]
    assert fps[0] is not None and fps[1:5] == [None] * 4 and fps[5] is not None
    assert fps[5]["hash"] == fps[0]["hash"]


def test_large_rounds_are_split_below_the_servers_sample_limit(tmp_path: Path) -> None:
    clock = Clock()
    run = tmp_path / "run"
    run.mkdir()
    cfg = AgentConfig(
        server="http://x.test",
        token="t",
        node="n",
        run_dir=run,
        spool_dir=tmp_path / "s",
        simulate_gpus=64,
        max_samples_per_batch=500,
        spool_fsync=False,
    )
    agent = Agent(cfg, clock=clock, transport=httpx.MockTransport(lambda r: httpx.Response(503)))
    agent.nvml.start()
    agent.round()
    bodies = spooled(agent)
    assert len(bodies) > 3
    assert all(len(b["samples"]) <= 500 for b in bodies)
    assert [b["seq"] for b in bodies] == sorted(b["seq"] for b in bodies)
    assert bodies[0]["fingerprint"] is not None and all(
        b["fingerprint"] is None for b in bodies[1:]
    )
    assert sum(len(b["samples"]) for b in bodies) == agent.spool.stats().produced_samples


def test_record_file_holds_every_batch_as_a_json_line(
    setup: tuple[Agent, Clock, FakeNVML, Path],
) -> None:
    agent, _clock, _fake, _run = setup
    agent.round()
    agent.round()
    agent.shutdown()
    lines = [json.loads(x) for x in agent.config.record.read_text().splitlines()]  # type: ignore[union-attr]
    assert [x["seq"] for x in lines] == [0, 1, 2]  # two rounds + the shutdown round
    assert all(set(x) == ENVELOPE | {"sent_at"} for x in lines)


def test_fault_files_are_applied_and_bad_ones_rejected(
    setup: tuple[Agent, Clock, FakeNVML, Path],
) -> None:
    agent, _clock, _fake, run = setup
    faults = run / "rlguard-simulate"
    faults.mkdir()
    (faults / "01.json").write_text('{"fault": "xid", "gpu": 1, "xid": 79}')
    (faults / "02.json").write_text('{"fault": "thermal", "gpu": 7}')
    (faults / "03.json").write_text('{"fault": "ecc_uncorrectable", "gpu": 0, "count": 2}')
    agent.round()
    assert sorted(p.name for p in faults.iterdir()) == [
        "01.json.applied",
        "02.json.rejected",
        "03.json.applied",
    ]
    samples = spooled(agent)[0]["samples"]

    def val(name: str, gpu: str) -> list[float]:
        return [s["value"] for s in samples if s["name"] == name and s["labels"].get("gpu") == gpu]

    assert val("gpu_lost", "1") == [1.0]
    assert val("gpu_xid_last_code", "1") == [79.0]
    assert val("gpu_ecc_uncorrected_errors_total", "0") == [2.0]
    assert val("gpu_lost", "0") == [0.0]


def test_status_reports_spool_and_drops(setup: tuple[Agent, Clock, FakeNVML, Path]) -> None:
    agent, _clock, _fake, _run = setup
    agent.round()
    agent.sender.deliver_one(wait=0)  # the scripted server answers 503
    agent.write_status()
    st = json.loads((agent.config.spool_dir / "status.json").read_text())
    assert st["spool_batches"] == 1 and st["send_failures"] == 1
    assert st["last_send_ok"] is None and "HTTP 503" in st["last_error"]
    assert st["dropped"] == {"spool_full": 0, "rejected": 0}
    assert st["produced_samples"] == st["spool_samples"] > 0
    assert st["simulated"] is True and st["gpus"] == 2


def test_without_nvml_job_signals_still_flow(tmp_path: Path) -> None:
    clock = Clock()
    run = tmp_path / "run"
    run.mkdir()
    HeartbeatReporter(run, "trainer", 0, clock=clock).update(step=9, force=True)
    cfg = AgentConfig(
        server="http://x.test",
        token="t",
        node="n",
        run_dir=run,
        spool_dir=tmp_path / "s",
        spool_fsync=False,
    )
    agent = Agent(
        cfg,
        nvml=FakeNVML(4, library_missing=True),
        clock=clock,
        transport=httpx.MockTransport(lambda r: httpx.Response(503)),
    )
    agent.nvml.start()
    agent.round()
    samples = spooled(agent)[0]["samples"]
    names = {s["name"] for s in samples}
    assert "train_step" in names and not any(n.startswith("gpu_") for n in names)
    assert [s["value"] for s in samples if s["name"] == "agent_nvml_available"] == [0.0]


def test_a_full_disk_loses_rounds_but_not_the_agent(
    setup: tuple[Agent, Clock, FakeNVML, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import errno
    import logging

    import agents.spool as spool_module

    agent, _clock, _fake, _run = setup
    real = spool_module.replace_file

    def full(path: Path, data: bytes, *, sync: bool = True) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module, "replace_file", full)
    with caplog.at_level(logging.ERROR, logger="rlguard.agent"):
        agent.round()
        agent.round()
    assert len([r for r in caplog.records if "round lost" in r.getMessage()]) == 1
    monkeypatch.setattr(spool_module, "replace_file", real)
    agent.round()
    st = agent.spool.stats()
    assert st.batches == 1 and st.dropped["spool_write_failed"] > 0
    assert st.produced_samples == st.samples + st.dropped["spool_write_failed"]


def test_many_participants_are_split_below_the_servers_limit(tmp_path: Path) -> None:
    clock = Clock()
    run = tmp_path / "run"
    (run / "heartbeat").mkdir(parents=True)
    for rank in range(2500):
        (run / "heartbeat" / f"rollout-{rank}.json").write_text(
            json.dumps({"role": "rollout", "rank": rank, "ts": clock.now, "phase": "ROLLOUT"})
        )
    cfg = AgentConfig(
        server="http://x.test",
        token="t",
        node="n",
        run_dir=run,
        spool_dir=tmp_path / "s",
        spool_fsync=False,
    )
    agent = Agent(
        cfg,
        nvml=FakeNVML(0),
        clock=clock,
        transport=httpx.MockTransport(lambda r: httpx.Response(503)),
    )
    agent.nvml.start()
    agent.round()
    bodies = spooled(agent)
    assert [len(b["participants"]) for b in bodies] == [1000, 1000, 500]
    assert sorted(p["rank"] for b in bodies for p in b["participants"]) == list(range(2500))


def test_a_failing_round_is_logged_and_the_loop_goes_on(
    setup: tuple[Agent, Clock, FakeNVML, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging
    import threading

    agent, _clock, _fake, _run = setup
    agent.config.interval = 0.05
    calls = {"n": 0}
    real = agent.jobs.collect

    def broken_once() -> tuple[list, list]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("collector bug")
        if calls["n"] >= 5:
            agent.request_stop()
        return real()

    monkeypatch.setattr(agent.jobs, "collect", broken_once)
    with caplog.at_level(logging.ERROR, logger="rlguard.agent"):
        worker = threading.Thread(target=agent.run)
        worker.start()
        worker.join(20)
    assert not worker.is_alive()
    assert agent.round_errors == 1
    assert any(r.exc_info and "collector bug" in str(r.exc_info[1]) for r in caplog.records)
    assert agent.rounds >= 4
