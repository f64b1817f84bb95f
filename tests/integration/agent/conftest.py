"""A real RLGuard server process and real agent processes for the agent's integration tests.

The server is started exactly as an operator would (``rlguard db upgrade``, ``rlguard token
create``, ``rlguard user create``, ``rlguard server``) in a data directory of its own. If the
server cannot be started, the tests fail (never skip).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness import AgentProcess
from tests.integration.agent._server import OperatedServer


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatedServer]:
    srv = OperatedServer(tmp_path_factory.mktemp("server-data"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def server(shared_server: OperatedServer) -> OperatedServer:
    """The shared server, running, with a node of this test's own (series never mix)."""
    if not shared_server.running:
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
