"""One real stack for a module of TRL integration tests (server start-up is the slow part);
each test runs its own job, with its own run directory and node agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.demo import DemoStack
from tests.harness import free_port
from tests.integration.integrations._trl import LaunchedRun, TRLStack, use_launch_hook


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoStack]:
    workdir: Path = tmp_path_factory.mktemp("trl-stack")
    s = TRLStack(workdir, free_port(), job="trl-boot", schedule=None)
    try:
        s.start_server()
        use_launch_hook(s)
        yield s
    finally:
        s.stop()


@pytest.fixture
def runs() -> Iterator[list[LaunchedRun]]:
    """The launched runs a test started, stopped after it whatever happened."""
    started: list[LaunchedRun] = []
    yield started
    for run in started:
        run.stop()
