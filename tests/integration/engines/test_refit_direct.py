"""A refit straight into a real vLLM engine's parameters (integrations.vllm.direct_load) serves
exactly what vLLM's own reload of the same weights from disk serves.

One engine for the module, with RLGuard's worker extension. Each check samples the same seeded
request after the refit and after ``Worker.reload_weights`` from the same weights saved as a
Hugging Face directory: tokens and logprobs must be identical (bit for bit: both end in the same
packed float32 weights). Several refits in a row also prove that the engine never keeps a
reference into the receiver's buffers, which the next pulls overwrite.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from integrations.vllm.client import Completion, EngineClient
from integrations.vllm.server import EngineSettings, VLLMServer
from integrations.vllm.worker_extension import specs_of
from recovery.transfer import (
    InMemoryRegistry,
    RegistryClient,
    RegistryServer,
    WeightPublisher,
    make_transport,
)
from tests.harness.vllm_engines import start_engine, stop_engine
from workload.engines.engine_host import EXTENSION
from workload.engines.lm_task import load_policy

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]
PROMPT = [5, 20, 33, 41, 7, 12]


@pytest.fixture(scope="module")
def engine(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    server = start_engine(
        tiny_model,
        tmp_path_factory.mktemp("refit-engine"),
        EngineSettings(worker_extension_cls=EXTENSION, max_model_len=64),
    )
    yield server
    stop_engine(server)


def _sample(client: EngineClient) -> Completion:
    client.reset_prefix_cache()
    return client.complete(PROMPT, max_tokens=12, seed=7, temperature=1.0, timeout=60.0)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_direct_refit_serves_what_the_reload_from_disk_serves(
    engine: VLLMServer, tiny_model: Path, tmp_path: Path, transport: str
) -> None:
    client = EngineClient(engine.url, engine.model_name, timeout=120.0)
    policy = load_policy(tiny_model)
    registry = RegistryServer(InMemoryRegistry())
    publisher = WeightPublisher(
        "policy",
        transport=make_transport(transport),
        registry=RegistryClient(registry.address, timeout=5.0),
    )
    base = 100 if transport == "shm" else 200  # versions only grow within the engine
    try:
        before = _sample(client)
        for round_ in range(3):
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            tensors = {n: p.detach().clone() for n, p in policy.named_parameters()}
            version = base + 2 * round_
            publisher.publish(version, tensors)
            source: dict[str, Any] = {
                "registry": registry.address,
                "version": version,
                "transport": transport,
                "specs": specs_of(tensors),
            }
            [done] = client.collective_rpc("rlguard_refit", source, timeout=60.0)
            assert done["load_path"] == "direct" and done["version"] == version
            refit = _sample(client)
            assert refit.token_ids != before.token_ids or refit.logprobs != before.logprobs
            on_disk = tmp_path / f"v{version}"
            policy.save_pretrained(on_disk)  # type: ignore[operator]  # a PreTrainedModel's
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(tiny_model / name, on_disk / name)
            client.collective_rpc("rlguard_load_from_disk", str(on_disk), version + 1, timeout=60.0)
            disk = _sample(client)
            assert (refit.token_ids, refit.logprobs) == (disk.token_ids, disk.logprobs)
            publisher.retire(version)
            before = disk
        # vLLM's own in-place reload, asked for by the request, lands on the same weights too.
        version = base + 10
        publisher.publish(version, tensors)
        [done] = client.collective_rpc(
            "rlguard_refit", {**source, "version": version, "direct": False}, timeout=60.0
        )
        assert done["load_path"].startswith("vllm-reload")
        assert (_sample(client).logprobs) == disk.logprobs
    finally:
        publisher.close()
        registry.close()
        client.close()
