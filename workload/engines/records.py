"""The files the engine processes and the job's router share in the run directory.

* ``engines/rollout-<rank>.json``, written by the engine host of that rank
  (:mod:`workload.engines.engine_host`): where its engine listens and the pids of its process
  tree (so that a successor can kill what is left of it), and whether the engine is up;
* ``engines/fleet.json``, written by the router in the trainer
  (:mod:`workload.engines.fleet`): each engine's admission state, the weight version it serves,
  and its train/inference disagreement; the engine hosts put it in their heartbeats, the tests
  and the benchmark read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from integrations.vllm.server import kill_leftovers as kill_tree
from workload.job import RunDir, read_json, write_json_atomic

# An engine's admission states (the router's view; the DESIGN's engine life, job side).
STARTING = "starting"  # its process tree is starting: compiling and loading are not faults
REFITTING = "refitting"  # up, loading the trainer's current weights
ADMITTED = "admitted"  # serving the trainer's current weight version: gets requests
QUARANTINED = "quarantined"  # failed: gets nothing until it is replaced and refit
STATES = (STARTING, REFITTING, ADMITTED, QUARANTINED)


def engines_dir(run: RunDir) -> Path:
    return run.root / "engines"


def record_path(run: RunDir, rank: int) -> Path:
    return engines_dir(run) / f"rollout-{rank}.json"


def fleet_path(run: RunDir) -> Path:
    return engines_dir(run) / "fleet.json"


@dataclass(frozen=True)
class EngineRecord:
    """One engine process tree, as its host wrote it."""

    rank: int
    url: str
    model: str
    host_pid: int
    pids: dict[str, int]  # level (api_server, engine_core, worker) -> pid
    warm: bool
    ready: bool
    started: float
    ready_at: float | None

    @property
    def incarnation(self) -> str:
        return f"{self.host_pid}:{self.pids.get('api_server', 0)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "url": self.url,
            "model": self.model,
            "host_pid": self.host_pid,
            "pids": self.pids,
            "warm": self.warm,
            "ready": self.ready,
            "started": self.started,
            "ready_at": self.ready_at,
        }

    @staticmethod
    def from_json(body: dict[str, Any]) -> EngineRecord:
        return EngineRecord(
            rank=int(body["rank"]),
            url=str(body["url"]),
            model=str(body["model"]),
            host_pid=int(body["host_pid"]),
            pids={str(k): int(v) for k, v in (body.get("pids") or {}).items()},
            warm=bool(body.get("warm")),
            ready=bool(body.get("ready")),
            started=float(body.get("started") or 0.0),
            ready_at=None if body.get("ready_at") is None else float(body["ready_at"]),
        )

    def alive(self) -> bool:
        """Whether every process of the tree still runs (a zombie does not)."""
        return all(_running(pid) for pid in self.pids.values())


def write_record(run: RunDir, record: EngineRecord) -> None:
    write_json_atomic(record_path(run, record.rank), record.to_json())


def read_record(run: RunDir, rank: int) -> EngineRecord | None:
    body = read_json(record_path(run, rank))
    if body is None:
        return None
    try:
        return EngineRecord.from_json(body)
    except (KeyError, TypeError, ValueError):
        return None


def kill_leftovers(record: EngineRecord, *, spare: set[int], timeout: float = 10.0) -> list[int]:
    """SIGKILL what is left of ``record``'s process tree, its host included (a SIGSTOPped engine
    too), except the pids in ``spare``; the pids killed (:func:`integrations.vllm.server.
    kill_leftovers`). A process created after the record's last write (its pids were all
    running then; 1 s for the clocks' granularity) holds a reused pid and is spared."""
    written = (record.ready_at or record.started) + 1.0
    return kill_tree(
        [record.host_pid, *record.pids.values()],
        spare=spare,
        created_before=written,
        timeout=timeout,
    )


def _running(pid: int) -> bool:
    """Exists and is not a zombie (a killed child of someone else waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def read_fleet(run: RunDir) -> dict[str, Any]:
    return read_json(fleet_path(run)) or {}
