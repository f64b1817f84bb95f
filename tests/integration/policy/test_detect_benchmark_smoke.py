"""benchmarks/detect.py's in-process parts still run end to end (tiny sizes; the figures are not
judged here). The latency part starts servers and workers and is left to the benchmark."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run(*args: str) -> str:
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "detect.py"),
            "--nodes",
            "12",
            "--gpus",
            "2",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_tick_part_prints_the_tick_beside_its_baselines() -> None:
    out = _run("--part", "tick", "--ticks", "4", "--arrivals")
    assert re.search(r"^tick: baseline .* p50 \d+\.\d ms$", out, re.M), out
    assert re.search(r"^tick: without the Detection v2 detectors .* p99 \d+\.\d ms$", out, re.M), (
        out
    )
    # its faults (nodes 3, 7, 11: a slow state log, a throttling GPU, a silent participant) found
    m = re.search(r"^tick: policy tick p50 .* \((\d+) decisions over 4 ticks\)$", out, re.M)
    assert m and int(m.group(1)) > 0, out
    assert re.search(
        r"^tick: the server's participant read .* read \+ tick p99 \d+\.\d ms$", out, re.M
    ), out
    assert re.search(r"^tick: ratio tick/baseline \d+\.\d\dx", out, re.M), out


def test_ingest_share_part_prints_both_rounds_and_their_ratio() -> None:
    out = _run("--part", "ingest-share", "--ticks", "2")
    assert re.search(
        r"^ingest share: store\.extend of [\d,]+ samples .* no engine p50 \d+\.\d ms, with the engine's "
        r"standing questions p50 \d+\.\d ms .* ratio \d+\.\d\dx$",
        out,
        re.M,
    ), out


def test_a_size_below_one_is_refused_with_its_name() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "detect.py"), "--part", "tick", "--nodes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 2 and "--nodes must be at least 1" in r.stderr
