"""The node's environment fingerprint: what a training process here would run with.

Versions are read without importing the heavy packages (importing torch would cost the agent a
few hundred MB of memory): package versions come from ``importlib.metadata``, torch's CUDA and
NCCL builds from the text of its ``torch/version.py`` and the NCCL wheel's metadata, the driver
from NVML. The result is a flat ``{str: str}`` with a ``hash`` over everything else, so a
dashboard or detector compares one value across the nodes of a job.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import sys

import orjson

DEFAULT_PACKAGES: tuple[str, ...] = (
    "torch",
    "numpy",
    "transformers",
    "vllm",
    "verl",
    "ray",
    "deepspeed",
    "flash-attn",
    "megatron-core",
    "nvidia-nccl-cu12",
    "nvidia-cuda-runtime-cu12",
    "rlguard",
)
_TORCH_VERSION_FIELD = re.compile(
    r"^(cuda|git_version)\s*(?::[^=]*)?=\s*['\"]?([^'\"\n]*)['\"]?", re.M
)
_MAX_VALUE = 500  # the server's limit on a fingerprint value is 512 characters


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_build() -> dict[str, str]:
    """CUDA runtime that torch was built against, read from torch/version.py without importing."""
    try:
        files = importlib.metadata.files("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    for f in files:
        if str(f).replace("\\", "/") == "torch/version.py":
            try:
                text = f.read_text()
            except OSError:
                return {}
            found: dict[str, str] = {
                m.group(1): m.group(2) for m in _TORCH_VERSION_FIELD.finditer(text)
            }
            cuda = found.get("cuda", "").strip()
            return {"cuda_runtime": cuda if cuda and cuda != "None" else "none"}
    return {}


def collect_fingerprint(
    packages: tuple[str, ...] | list[str] = DEFAULT_PACKAGES,
    *,
    driver: dict[str, str] | None = None,
) -> dict[str, str]:
    """Build the fingerprint; ``driver`` is what the NVML collector reported (may be empty).

    Packages that are not installed appear as ``absent`` so that "installed on one node only"
    is a difference too.
    """
    fp: dict[str, str] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    fp.update(_torch_build())
    nccl = _package_version("nvidia-nccl-cu12") or _package_version("nvidia-nccl-cu11")
    fp["nccl"] = nccl if nccl else "unknown"
    for key, value in (driver or {}).items():
        fp[key] = value
    for name in packages:
        fp[f"pkg:{name}"] = _package_version(name) or "absent"
    fp = {k[:128]: v[:_MAX_VALUE] for k, v in fp.items()}
    fp["hash"] = fingerprint_hash(fp)
    return fp


def fingerprint_hash(fp: dict[str, str]) -> str:
    """sha256 (first 16 hex digits) over the sorted items, ignoring any existing ``hash`` key."""
    canonical = orjson.dumps(
        {k: v for k, v in fp.items() if k != "hash"}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(canonical).hexdigest()[:16]
