"""Environment fingerprint: contents, stable hash, limits."""

from __future__ import annotations

import importlib.metadata

from agents.fingerprint import collect_fingerprint, fingerprint_hash


def test_contents_and_hash() -> None:
    fp = collect_fingerprint(
        ["torch", "surely-not-installed-pkg"], driver={"driver": "550.1", "cuda_driver": "12.4"}
    )
    assert fp["python"].count(".") == 2
    assert fp["pkg:torch"] == importlib.metadata.version("torch")
    assert fp["pkg:surely-not-installed-pkg"] == "absent"
    assert fp["driver"] == "550.1" and fp["cuda_driver"] == "12.4"
    assert "cuda_runtime" in fp and "nccl" in fp
    assert fp["hash"] == fingerprint_hash(fp)
    again = collect_fingerprint(
        ["torch", "surely-not-installed-pkg"], driver={"driver": "550.1", "cuda_driver": "12.4"}
    )
    assert again == fp
    other = collect_fingerprint(
        ["torch", "surely-not-installed-pkg"], driver={"driver": "555.0", "cuda_driver": "12.4"}
    )
    assert other["hash"] != fp["hash"]
    assert all(len(k) <= 128 and len(v) <= 512 for k, v in fp.items())


def test_torch_is_not_imported_to_fingerprint() -> None:
    import subprocess
    import sys

    code = "import sys; from agents.fingerprint import collect_fingerprint; collect_fingerprint(); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"
