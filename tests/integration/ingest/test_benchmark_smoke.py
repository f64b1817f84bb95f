"""benchmarks/ingest.py still runs end to end (tiny sizes; the figures are not judged here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


def test_ingest_benchmark_smoke() -> None:
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ingest.py"),
            "--clients",
            "1",
            "--seconds",
            "0.5",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=170,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for name in ("baseline", "ingest"):
        m = re.search(rf"^{name}\s+([\d,]+) samples/s .* \((\d+) requests, 0 errors\)$", out, re.M)
        assert m, out
        assert int(m.group(2)) > 0
        # the next line: the server's own CPU time per request (read from /proc), and how busy
        cpu = re.search(
            rf"^{name}\s.*\n\s+server CPU\s+(\d+) us per request, busy (\d+\.\d\d) of a core$",
            out,
            re.M,
        )
        assert cpu, out
        assert int(cpu.group(1)) > 0
    assert re.search(r"^ratio ingest/baseline = \d+\.\d\d", out, re.M), out
