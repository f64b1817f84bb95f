"""What the agent sent from a real NVIDIA H200, accepted by the server as it stands.

``recorded/h200_agent_batches.jsonl`` is the ``--record`` output of ``python -m agents`` run
against the real NVML on an H200 machine (``bash scripts/gpu-check.sh``, 2026-12-04, driver
580.159.04): nine rounds, byte for byte. The CPU-only tests build their batches from the fake;
this one keeps the server honest about the real thing.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from app.core.config import IngestLimits
from app.ingest.validation import BatchValidator

RECORDED = Path(__file__).parent / "recorded" / "h200_agent_batches.jsonl"


def test_the_server_accepts_every_sample_a_real_h200_agent_sent() -> None:
    lines = RECORDED.read_bytes().splitlines()
    assert len(lines) == 9
    for line in lines:
        sent = orjson.loads(line)
        # The server judges timestamps against its own clock: here, the moment the batch was sent.
        batch = BatchValidator(IngestLimits(), clock=lambda sent=sent: sent["sent_at"]).validate(
            line
        )
        assert len(batch.samples) == len(sent["samples"]) == 30
        names = {key.name for key, _, _ in batch.samples}
        assert {
            "gpu_info",
            "gpu_memory_total_bytes",
            "gpu_power_watts",
            "gpu_sm_clock_hertz",
        } <= names
    info = [s for s in sent["samples"] if s["name"] == "gpu_info"]
    assert [s["labels"]["model"] for s in info] == ["NVIDIA H200"]
    assert not any("simulated" in s["labels"] for s in sent["samples"])
