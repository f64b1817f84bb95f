"""benchmarks/flood.py still runs end to end (a few seconds per phase; the figures are not judged
here, only that the calm node was served and the flood was refused by the quotas)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_flood_benchmark_smoke() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flood.py"), "--seconds", "4", "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=230,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for phase in ("idle", "flood"):
        m = re.search(
            rf"^calm node, {phase} *: p50 [\d.]+ ms, p99 [\d.]+ ms \((\d+) requests, errors 0\)$",
            out,
            re.M,
        )
        assert m and int(m.group(1)) > 0, out
    assert re.search(r"^ratio p99 flood/idle: [\d.]+x", out, re.M), out
    assert re.search(r"^server RSS: idle \d+ MiB, peak during flood \d+ MiB", out, re.M), out
    assert re.search(r"^policy ticks skipped: idle \d+, flood \d+", out, re.M), out
    answers = re.search(r"^flooder's answers: (\{.*\})$", out, re.M)
    assert answers and ("422" in answers.group(1) or "429" in answers.group(1)), out
    assert "rlguard_ingest_quota_refusals{node=flood," in out, out
