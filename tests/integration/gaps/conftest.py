"""The policy integration tests' real stack (server process, workers, SQLite or PostgreSQL +
Redis), reused here, plus a real node agent process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.policy.conftest import ROOT, RedisServer, Stack, fast_policy


class AgentProcess:
    """``python -m agents`` with one simulated GPU, watching ``run_dir`` for ``stack``."""

    def __init__(self, stack: Stack, node: str, run_dir: Path) -> None:
        self.log_path = stack.tmp / f"agent-{node}.log"
        token_file = stack.tmp / f"token-{node}"
        token_file.write_text(stack.node_tokens[node])
        token_file.chmod(0o600)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "agents",
                "--server", stack.base_url,
                "--token-file", str(token_file),
                "--node", node,
                "--run-dir", str(run_dir),
                "--simulate-gpus", "1",
                "--interval", "0.5",
                "--spool-dir", str(stack.tmp / f"spool-{node}"),
            ],
            env=stack.env, cwd=ROOT, stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


@pytest.fixture
def embedded_stack(tmp_path: Path) -> Iterator[Stack]:
    """Server with the policy scheduler on, embedded SQLite database and broker."""
    stack = Stack(
        tmp_path,
        database_url=f"sqlite:///{tmp_path / 'rlguard.db'}",
        redis=None,
        policy=fast_policy(tmp_path / "policy.yaml"),
    )
    try:
        yield stack
    finally:
        stack.close()


@pytest.fixture(params=["embedded", "postgres+redis"])
def any_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """The stack in both modes: embedded (SQLite, SQLAlchemy broker) and PostgreSQL + a Redis
    of our own on a free port."""
    if request.param == "embedded":
        yield request.getfixturevalue("embedded_stack")
        return
    redis = RedisServer(tmp_path)
    redis.start()
    stack = Stack(
        tmp_path,
        database_url=request.getfixturevalue("postgres_url"),
        redis=redis,
        policy=fast_policy(tmp_path / "policy.yaml"),
    )
    try:
        yield stack
    finally:
        stack.close()
        redis.stop()


@pytest.fixture
def agents(embedded_stack: Stack) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()
