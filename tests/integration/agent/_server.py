"""A real RLGuard server set up as an operator would (``rlguard db upgrade``, ``rlguard token
create``, ``rlguard user create``, ``rlguard server``), agents against it, and what it holds."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import RLGUARD, AgentProcess, ServerProcess, free_port, run_cli, wait_for


def _cli(env: dict[str, str], *args: str) -> str:
    out = run_cli(*args, env=env, timeout=120)
    if out.returncode != 0:
        pytest.fail(f"rlguard {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip()


class OperatedServer(ServerProcess):
    """``rlguard server`` on a fixed port, restartable on the same data directory, with a viewer
    token and a node token of its own."""

    def __init__(self, data_dir: Path, database_url: str | None = None) -> None:
        port = free_port()
        env = {**os.environ, "RLGUARD_DATA_DIR": str(data_dir), "RLGUARD_DEV": "1"}
        if database_url:
            env["RLGUARD_DATABASE_URL"] = database_url
        argv = [*RLGUARD, "server", "--host", "127.0.0.1", "--port", str(port)]
        super().__init__(argv, env, port, data_dir / "server.log", ready_path="/healthz")
        _cli(self.env, "db", "upgrade")
        self.user_token = _cli(self.env, "user", "create", "it-viewer", "--role", "viewer")
        self._nodes = 0
        self.use_new_node()

    def use_new_node(self) -> None:
        """Switch to a node (and its token) that no earlier test has used."""
        self._nodes += 1
        self.node = f"agent-it-node-{self._nodes}"
        self.node_token = _cli(self.env, "token", "create", "--node", self.node)

    def series(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every point the server holds for this node (all series, since the epoch)."""
        params: dict[str, Any] = {"node": self.node, "since": 0, "limit": 1000}
        if name:
            params["name"] = name
        r = httpx.get(
            self.url + "/api/v1/series",
            params=params,
            headers={"Authorization": f"Bearer {self.user_token}"},
            timeout=10,
        )
        r.raise_for_status()
        doc = r.json()
        assert not doc["truncated"]
        return list(doc["data"])


def agent_for(server: OperatedServer, run_dir: Path, spool_dir: Path, *extra: str) -> AgentProcess:
    """``python -m agents`` with simulated GPUs against ``server`` (not started yet)."""
    return AgentProcess(
        "--server",
        server.url,
        "--token",
        server.node_token,
        "--node",
        server.node,
        "--run-dir",
        str(run_dir),
        "--spool-dir",
        str(spool_dir),
        *extra,
        log_path=spool_dir.parent / f"{spool_dir.name}.agent.log",
        spool_dir=spool_dir,
    )


def _ingest_counts(server: OperatedServer) -> tuple[float, float]:
    """(batches applied to the store, batches committed) since the server process started."""
    accepted = committed = None
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith('rlguard_ingest_batches_total{result="accepted"} '):
            accepted = float(line.rsplit(" ", 1)[1])
        elif line.startswith("rlguard_ingest_commit_group_batches_sum "):
            committed = float(line.rsplit(" ", 1)[1])
    if accepted is None or committed is None:  # renamed metrics must not make this vacuous
        pytest.fail(f"/metrics lacks the ingest batch counters: {accepted=} {committed=}")
    return accepted, committed


def committed_points(server: OperatedServer, timeout: float = 30.0) -> set[tuple[str, str, float]]:
    """``points(server.series())`` once every batch in the store is committed (acknowledged).

    A batch is in the store before its group commit ends, and only a committed one is
    acknowledged: counting one still in flight would count a sample the server never
    acknowledged (and that the agent sends again). The read is taken between two identical
    "applied = committed" readings, so no batch was applied in between.
    """

    def settled() -> tuple[set[tuple[str, str, float]]] | None:
        before = _ingest_counts(server)
        if before[0] != before[1]:
            return None
        held = points(server.series())
        # wrapped: an empty set of points is an answer too
        return (held,) if _ingest_counts(server) == before else None

    return wait_for(
        settled, timeout, "ingest to settle", context=lambda: str(_ingest_counts(server))
    )[0]


def points(series: list[dict[str, Any]]) -> set[tuple[str, str, float]]:
    """(name, labels, ts) of every point; asserts no point appears twice within the list."""
    out: set[tuple[str, str, float]] = set()
    total = 0
    for s in series:
        labels = json.dumps(s["labels"], sort_keys=True)
        for ts, _value in s["points"]:
            out.add((s["name"], labels, ts))
            total += 1
    assert total == len(out), "the server holds a sample twice"
    return out
