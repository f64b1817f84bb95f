"""Probation: an engine quarantined for a transient reason comes back once it answers its health
probe, and only at the trainer's current weight version (refit first when stale); an engine
that fails the probe, or whose process tree is gone, stays out."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from integrations.vllm.client import EngineUnavailable
from workload.engines import fleet as fleet_module
from workload.engines import records
from workload.engines.fleet import EngineFleet
from workload.engines.records import ADMITTED, QUARANTINED, EngineRecord
from workload.job import RunDir, read_events

PROBATION_S = 0.3


class FakeEngine:
    """What the router calls on an engine: its health, the refit, the prefix cache."""

    def __init__(self) -> None:
        self.healthy_now = True
        self.version: int | None = None
        self.loads = True  # False: a refit that answers without loading (the old version stays)
        self.refits: list[int] = []
        self.lock = threading.Lock()

    def client(self, url: str, model: str, *, timeout: float = 60.0) -> FakeEngine:
        return self

    def healthy(self, timeout: float = 2.0) -> bool:
        return True

    def complete(
        self, prompt_ids: list[int], *, max_tokens: int, seed: int, timeout: float | None = None
    ) -> None:
        if not self.healthy_now:  # wedged: /health answers, requests do not finish
            raise EngineUnavailable("timed out")

    def collective_rpc(self, method: str, source: dict[str, Any], timeout: float) -> list[Any]:
        assert method == "rlguard_refit"
        with self.lock:
            self.refits.append(int(source["version"]))
            if self.loads:
                self.version = int(source["version"])
            return [{"version": self.version}]

    def reset_prefix_cache(self, timeout: float = 30.0) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture()
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    fake = FakeEngine()
    monkeypatch.setattr(fleet_module, "EngineClient", fake.client)
    return fake


def _fleet(tmp_path: Path, pid: int) -> EngineFleet:
    run = RunDir(tmp_path)
    run.root.mkdir(parents=True, exist_ok=True)
    records.write_record(
        run,
        EngineRecord(
            rank=0,
            url="http://127.0.0.1:1",
            model="m",
            host_pid=pid,
            pids={"api_server": pid, "engine_core": pid, "worker": pid},
            warm=False,
            ready=True,
            started=time.time(),
            ready_at=time.time(),
        ),
    )
    fleet = EngineFleet(
        run, 1, refit_source=lambda v: {"version": v}, poll=0.02, probation_s=PROBATION_S
    )
    fleet.start()
    return fleet


def _wait_state(fleet: EngineFleet, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    with fleet._lock:
        while fleet.slots[0].state != state:
            left = deadline - time.monotonic()
            assert left > 0, f"engine is {fleet.slots[0].state}, expected {state}"
            fleet._lock.wait(min(left, 0.05))


def _events(fleet: EngineFleet, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_events(fleet.run) if e["kind"] == kind]


def test_a_healthy_engine_is_readmitted_after_its_probation(
    tmp_path: Path, engine: FakeEngine
) -> None:
    fleet = _fleet(tmp_path, os.getpid())
    try:
        fleet.set_target(1)
        assert fleet.wait_all_admitted(timeout=10.0)
        engine.healthy_now = False  # the request failed because the engine was briefly sick
        fleet.quarantine(0, "request r1 failed: timed out")
        quarantined = time.monotonic()
        # The probe fails: still out, and a new window starts.
        deadline = time.monotonic() + 10.0
        while not _events(fleet, "engine_probation"):
            assert time.monotonic() < deadline, "no probation probe"
            time.sleep(0.02)
        assert fleet.slots[0].state == QUARANTINED and fleet.admitted() == []
        assert _events(fleet, "engine_probation")[0]["outcome"] == "failed"
        assert time.monotonic() - quarantined >= PROBATION_S  # not before its window
        engine.healthy_now = True
        _wait_state(fleet, ADMITTED)
        healthy = [e for e in _events(fleet, "engine_probation") if e["outcome"] == "healthy"]
        assert len(healthy) == 1 and healthy[0]["refit_first"] is False
        [back] = _events(fleet, "engine_readmitted")
        assert back["probation"] is True and back["version"] == 1
    finally:
        fleet.close()


def test_a_stale_engine_is_refit_before_it_is_readmitted(
    tmp_path: Path, engine: FakeEngine
) -> None:
    fleet = _fleet(tmp_path, os.getpid())
    try:
        fleet.set_target(1)
        assert fleet.wait_all_admitted(timeout=10.0)
        fleet.quarantine(0, "request r1 failed: HTTP 500")
        engine.loads = False  # its refits answer without loading: it keeps v1
        fleet.set_target(2)  # the trainer moved on while the engine was out
        deadline = time.monotonic() + 10.0
        while 2 not in engine.refits:
            assert time.monotonic() < deadline, "the stale engine was never refit"
            time.sleep(0.02)
        [probe] = [e for e in _events(fleet, "engine_probation") if e["outcome"] == "healthy"]
        assert probe["refit_first"] is True and (probe["version"], probe["target"]) == (1, 2)
        # A refit that left it on v1: never admitted stale.
        time.sleep(PROBATION_S)  # a few router rounds (poll 0.02 s): nothing may admit it
        assert fleet.admitted() == [] and engine.version == 1
        assert not _events(fleet, "engine_readmitted")
        engine.loads = True
        fleet.set_target(3)  # the next refit loads
        _wait_state(fleet, ADMITTED)
        assert fleet.slots[0].version == 3 == engine.version
        [back] = _events(fleet, "engine_readmitted")
        assert back["probation"] is True and back["version"] == 3
    finally:
        fleet.close()


def test_a_dead_tree_gets_no_probation(tmp_path: Path, engine: FakeEngine) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    child = done.pid  # a pid that no longer runs
    fleet = _fleet(tmp_path, os.getpid())
    try:
        fleet.set_target(1)
        assert fleet.wait_all_admitted(timeout=10.0)
        fleet.quarantine(0, "request r1 failed: connection refused")
        record = records.read_record(fleet.run, 0)
        assert record is not None
        # Its worker died: same incarnation (the api server's pid), a worker that is gone.
        records.write_record(
            fleet.run, EngineRecord(**{**record.__dict__, "pids": {**record.pids, "worker": child}})
        )
        time.sleep(PROBATION_S * 3)
        assert fleet.slots[0].state == QUARANTINED and not fleet.slots[0].transient
        assert not _events(fleet, "engine_probation")
    finally:
        fleet.close()


def test_probation_can_be_turned_off_and_refuses_a_bad_window(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="probation_s"):
        EngineFleet(RunDir(tmp_path), 1, refit_source=lambda v: {}, probation_s=-1.0)
    fleet = EngineFleet(RunDir(tmp_path), 1, refit_source=lambda v: {}, probation_s=None)
    assert fleet.probation_s is None


def test_the_job_setting_is_checked() -> None:
    from workload.job import JobConfig, JobConfigError

    assert JobConfig(job="j", steps=1).engine_probation_s == 30.0
    assert JobConfig(job="j", steps=1, engine_probation_s=None).engine_probation_s is None
    with pytest.raises(JobConfigError, match="engine_probation_s"):
        JobConfig(job="j", steps=1, engine_probation_s=-2)
