"""One real vLLM engine per test module (starting one takes 20-60 s), on the tiny model built
once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from integrations.vllm.server import VLLMServer
from tests.harness.vllm_engines import start_engine, stop_engine, tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="module")
def vllm_engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A healthy, warmed-up engine shared by the module's tests. A test that kills part of it
    takes a fresh one instead (``fresh_engine``)."""
    server = start_engine(tiny_model, tmp_path_factory.mktemp("vllm-engine"))
    yield server
    stop_engine(server)
