"""benchmarks/ettr.py --ray still runs end to end (5 steps, one kill; the figures are not judged
here, only that each way ran, the kills happened and every way ends with the clean parameters)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


def test_ettr_ray_benchmark_smoke() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ettr.py"), "--ray", "--steps", "5", "--fault-every", "3"],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )  # fmt: skip
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    for way, kills in (("clean", 0), ("rlguard", 1), ("whole-job", 1)):
        assert re.search(rf"^{way}\s+[\d.]+\s+[\d.]+\s+{kills}\s+True$", out, re.M), out
    assert re.search(r"^ETTR rlguard [\d.]+ \(target >= 0.90: (met|NOT met)\), whole-job resubmission "
                     r"[\d.]+ \(2 submissions\), ratio [\d.]+x$", out, re.M), out  # fmt: skip
    assert re.search(r"^kill -> restart_done \(rlguard\): .* seen for 1 of 1 kills$", out, re.M), (
        out
    )


def test_bad_options_end_in_one_line_before_ray_starts() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ettr.py"), "--ray", "--steps", "6", "--fault-every", "1"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 2 and "--fault-every 1 must be in 2..steps-1" in r.stderr, r.stderr
