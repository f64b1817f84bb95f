"""A real RLGuard server process and real agent processes for the agent's integration tests.

The server is started exactly as an operator would (``rlguard db upgrade``, ``rlguard token
create``, ``rlguard user create``, ``rlguard server``) in a data directory of its own. If the
server cannot be started, the tests fail (never skip).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[3]
RLGUARD = str(Path(sys.executable).with_name("rlguard"))


def _cli(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [RLGUARD, *args], env=env, capture_output=True, text=True, timeout=120, cwd=REPO
    )
    if out.returncode != 0:
        pytest.fail(f"rlguard {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip()


class ServerProcess:
    """``rlguard server`` on a fixed port, restartable on the same data directory."""

    def __init__(self, data_dir: Path, database_url: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "RLGUARD_DATA_DIR": str(data_dir), "RLGUARD_DEV": "1"}
        if database_url:
            self.env["RLGUARD_DATABASE_URL"] = database_url
        self.log_path = data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        _cli(self.env, "db", "upgrade")
        self.user_token = _cli(self.env, "user", "create", "it-viewer", "--role", "viewer")
        self._nodes = 0
        self.use_new_node()

    def use_new_node(self) -> None:
        """Switch to a node (and its token) that no earlier test has used."""
        self._nodes += 1
        self.node = f"agent-it-node-{self._nodes}"
        self.node_token = _cli(self.env, "token", "create", "--node", self.node)

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [RLGUARD, "server", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"rlguard server exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(
            f"rlguard server did not answer /healthz within 60 s: {self.log_path.read_text()[-2000:]}"
        )

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

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


class AgentProcess:
    """``python -m agents`` with simulated GPUs, against ``server``."""

    def __init__(self, server: ServerProcess, run_dir: Path, spool_dir: Path, *extra: str) -> None:
        self.spool_dir = spool_dir
        self.args = [
            sys.executable,
            "-m",
            "agents",
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
        ]
        self.log_path = spool_dir.parent / f"{spool_dir.name}.agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def terminate(self, timeout: float = 5.0) -> float:
        """SIGTERM and wait; returns how long the exit took."""
        assert self.proc is not None
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        took = time.monotonic() - start
        assert rc == 0, self.log_path.read_text()[-2000:]
        self.proc = None
        return took

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def status(self) -> dict[str, Any]:
        return dict(json.loads((self.spool_dir / "status.json").read_text()))


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("server-data"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server(shared_server: ServerProcess) -> ServerProcess:
    """The shared server, running, with a node of this test's own (series never mix)."""
    if shared_server.proc is None or shared_server.proc.poll() is not None:
        shared_server.start()
    shared_server.use_new_node()
    return shared_server


@pytest.fixture
def agents_started() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    try:
        yield started
    finally:
        for agent in started:
            agent.kill()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def _ingest_counts(server: ServerProcess) -> tuple[float, float]:
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


def committed_points(server: ServerProcess, timeout: float = 30.0) -> set[tuple[str, str, float]]:
    """``points(server.series())`` once every batch in the store is committed (acknowledged).

    A batch is in the store before its group commit ends, and only a committed one is
    acknowledged: counting one still in flight would count a sample the server never
    acknowledged (and that the agent sends again). The read is taken between two identical
    "applied = committed" readings, so no batch was applied in between.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = _ingest_counts(server)
        if before[0] == before[1]:
            held = points(server.series())
            if _ingest_counts(server) == before:
                return held
        time.sleep(0.1)
    pytest.fail(f"ingest did not settle within {timeout} s: {_ingest_counts(server)}")


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
