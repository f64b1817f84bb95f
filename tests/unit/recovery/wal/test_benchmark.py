"""Smoke run of benchmarks/wal.py with tiny sizes: it must run and print every figure."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

BENCHMARK = Path(__file__).resolve().parents[4] / "benchmarks" / "wal.py"


def test_benchmark_prints_all_four_figures_with_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("wal_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    argv = ["--records", "20", "--block", "5", "--rounds", "1", "--processes", "2"]
    argv += ["--threads", "2", "--per-writer", "6", "--step-records", "3"]
    argv += ["--steps", "2", "--step-ms", "5"]
    assert module.main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label in ("disk:", "(a)", "(b)", "(c)", "(d)"):
        assert label in out
    # (a), then (b) and (c) for 1 thread, 2 threads, and 1 thread logging 3-record steps
    assert len(re.findall(r"-> \d+\.\d+x", out)) == 7
    assert "2 proc x 1 thr, 3 records (one step) per append_many" in out
    # each shape says how many records a sync covered and what bounds it
    assert len(re.findall(r"\d+\.\d records per sync of mean \d+ us", out)) == 3
    assert len(re.findall(r"ceilings: no fsync at all .* -> this shape: 5x is", out)) == 3
    assert len(re.findall(r"syncing a file of its own .* rec/s = \d+\.\d+x naive", out)) == 3
    assert len(re.findall(r"target >= 5x: (met|not met)", out)) == 6
    assert re.search(r"overhead -?\d+\.\d+ %", out)
    assert list(tmp_path.iterdir()) == []  # the benchmark cleans up after itself
