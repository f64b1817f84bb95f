"""The exit-cause catalogue: the shipped file loads, each class matches PyTorch's, NCCL's,
vLLM's, Ray's and the kernel's real lines, its must-not-fire twins do not, and a bad file is
refused naming its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from recovery.supervision.exit_causes import (
    EVIDENCE_CHARS,
    CatalogueError,
    clip,
    load_catalogue,
)

CATALOGUE = load_catalogue()


@pytest.mark.parametrize(
    ("line", "signal", "cause"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
            "total capacity of 79.15 GiB of which 1.06 GiB is free.",
            None,
            "cuda_oom",
        ),
        ("torch.cuda.OutOfMemoryError: CUDA error: out of memory", None, "cuda_oom"),
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "SIGABRT",
            "cuda_illegal_access",
        ),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", None, "gpu_ecc_error"),
        ("OSError: [Errno 28] No space left on device: '/ckpt/x.tmp'", None, "disk_full"),
        ("OSError: [Errno 122] Disk quota exceeded", None, "disk_full"),
        ("OSError: [Errno 30] Read-only file system: '/ckpt'", None, "filesystem_read_only"),
        (
            "oom-kill: the kernel's OOM killer ended a process of this cgroup",
            "SIGKILL",
            "host_oom_killed",
        ),
        (
            "[rank1]:[E1205 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600047 milliseconds",
            "SIGABRT",
            "collective_timeout",
        ),
        (
            "ERROR 12-05 [core_client.py:564] EngineCore encountered a fatal error.",
            None,
            "engine_fatal",
        ),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            None,
            "engine_fatal",
        ),
        ("TimeoutError: RPC call to sample_tokens timed out.", None, "engine_fatal"),
        (
            "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
            None,
            "ray_actor_died",
        ),
    ],
)
def test_each_class_matches_its_real_line(line: str, signal: str | None, cause: str) -> None:
    found = CATALOGUE.match(["INFO step 12 loss=0.41", line, "Traceback ends"], exit_signal=signal)
    assert found is not None and found.cause == cause, found
    assert len(found.line) <= EVIDENCE_CHARS + 1


@pytest.mark.parametrize(
    ("line", "signal"),
    [
        ("Killed", "SIGKILL"),  # a shell's word for any SIGKILL: a person's kill -9 too
        ("oom-kill: the kernel's OOM killer ended a process", None),  # only for a SIGKILL
        (
            "WARNING: NCCL_ASYNC_ERROR_HANDLING is deprecated, use TORCH_NCCL_ASYNC_ERROR_HANDLING",
            None,
        ),
        (
            "INFO: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to reduce fragmentation",
            None,
        ),
        ("INFO engine started; health check ok; no fatal error", None),
        ("RuntimeError: shape mismatch [4, 8] vs [8, 4]", None),
    ],
)
def test_must_not_fire_lines_have_no_cause(line: str, signal: str | None) -> None:
    assert CATALOGUE.match([line], exit_signal=signal) is None


def test_catalogue_order_is_priority_and_the_newest_line_is_the_evidence() -> None:
    lines = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB (first)",
        "ERROR EngineCore encountered a fatal error.",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB (newest)",
        "vllm.v1.engine.exceptions.EngineDeadError",
    ]
    found = CATALOGUE.match(lines, exit_signal=None)
    assert found is not None and found.cause == "cuda_oom" and "(newest)" in found.line


def test_a_long_line_is_clipped_around_its_match() -> None:
    text = "x" * 300 + " Watchdog caught collective operation timeout " + "y" * 300
    start = text.index("Watchdog")
    piece = clip(text, start, start + 40)
    assert "Watchdog caught collective" in piece and piece.startswith("…")
    assert len(piece) <= EVIDENCE_CHARS + 1


def test_every_row_has_a_source_and_a_known_kind() -> None:
    assert len(CATALOGUE.rows) >= 8
    assert all(r.source and r.kind and r.line > 0 for r in CATALOGUE.rows)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("causes: []\n", "needs a non-empty list 'causes'"),
        ("[unclosed\n", "not valid YAML"),
        ("causes:\n  - just text\n", "line 2: a row must be a mapping"),
        (
            "causes:\n  - {cause: a, pattern: x, kind: cuda_oom, tier: light, plan: [], source: s}\n"
            "  - {cause: a, pattern: y, kind: cuda_oom, tier: light, plan: [], source: s}\n",
            "line 3: cause 'a' is listed twice (first at line 2)",
        ),
        (
            "causes:\n  - {cause: A-b, pattern: x, kind: cuda_oom, tier: light, plan: [], source: s}\n",
            "line 2: cause 'A-b' must be snake_case",
        ),
        (
            "causes:\n  - {cause: a, pattern: '(?<=x)y', kind: cuda_oom, tier: light, plan: [], "
            "source: s}\n",
            "line 2: pattern '(?<=x)y' of 'a' is not valid",
        ),
        (
            "causes:\n  - {cause: a, pattern: x, kind: cuda_oom, tier: light, plan: [], source: s,"
            " signals: [SIGNOPE]}\n",
            "line 2: signals: 'SIGNOPE' is not a signal name",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_its_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(CatalogueError) as exc:
        load_catalogue(path)
    assert needle in str(exc.value) and str(path) in str(exc.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogueError, match="cannot be read"):
        load_catalogue(tmp_path / "nope.yaml")
