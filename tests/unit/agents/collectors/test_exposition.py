"""ExpositionReader: only the named families, a known series reads just its value, counters
named as prometheus_client names them, malformed pages refused."""

from __future__ import annotations

import pytest

from agents.collectors.exposition import ExpositionReader, ScrapeError
from tests.unit.agents.collectors.expositions import DCGM, VLLM, set_value


def test_reads_only_the_named_families_and_names_counters_with_total() -> None:
    reader = ExpositionReader(("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"))
    got = {(s.name, s.labels["gpu"]): s.value for s in reader.parse(DCGM)}
    assert got == {
        ("DCGM_FI_DEV_GPU_UTIL", "0"): 97,
        ("DCGM_FI_DEV_GPU_UTIL", "1"): 35,
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total", "0"): 0,  # a counter, as the parser names it
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total", "1"): 2,
    }
    vllm = ExpositionReader(("vllm:generation_tokens_total", "vllm:num_requests_waiting"))
    names = {s.name for s in vllm.parse(VLLM)}
    assert names == {"vllm:generation_tokens_total", "vllm:num_requests_waiting"}


def test_a_known_series_gets_its_new_value_and_a_bad_value_is_refused() -> None:
    reader = ExpositionReader(("DCGM_FI_DEV_GPU_TEMP",))
    reader.parse(DCGM)
    again = reader.parse(set_value(DCGM, "DCGM_FI_DEV_GPU_TEMP", 88, gpu="1"))
    assert sorted(s.value for s in again) == [61, 88]
    with pytest.raises(ScrapeError, match="bad value"):
        reader.parse(set_value(DCGM, "DCGM_FI_DEV_GPU_TEMP", "hot", gpu="1"))


@pytest.mark.parametrize(
    "page",
    [
        'DCGM_FI_DEV_GPU_TEMP{gpu="0" 5\n',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",gpu="1"} 5\n',
        "DCGM_FI_DEV_GPU_TEMP\n",
    ],
)
def test_malformed_series_are_refused(page: str) -> None:
    with pytest.raises(ScrapeError):
        ExpositionReader(("DCGM_FI_DEV_GPU_TEMP",)).parse(page)
