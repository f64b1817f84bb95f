"""The checks that need a real NVIDIA GPU (``bash scripts/gpu-check.sh``).

They are not part of the default suite (``norecursedirs`` in pyproject.toml keeps a plain
``pytest`` out of this folder): CI has no GPU. Run here on a machine without one they stop at
once with a message saying so, never as skips.
"""

from __future__ import annotations

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    import pynvml
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError(
            "tests/on_gpu need an NVIDIA GPU: torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})"
        )
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise pytest.UsageError(f"tests/on_gpu need NVML: nvmlInit failed: {exc!r}") from exc
