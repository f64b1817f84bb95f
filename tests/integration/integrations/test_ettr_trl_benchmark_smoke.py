"""benchmarks/ettr_trl.py still runs end to end (tiny sizes; the figures are not judged here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]


def test_ettr_trl_benchmark_smoke(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ettr_trl.py"), "--size", "tiny", "--steps", "6",
         "--fault-every", "3", "--save-steps", "2", "--overhead-steps", "2", "--no-standby",
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=400, cwd=ROOT,
    )  # fmt: skip
    out = r.stdout
    assert r.returncode == 0, out[-3000:] + r.stderr[-3000:]
    assert re.search(r"^clean median step [\d.]+ s; scale factor [\d.]+ ", out, re.M), out
    for way, faults in (("clean", 0), ("rlguard", 1), ("shell-retry", 1)):
        assert re.search(rf"^{way}\s+[\d.]+\s+[\d.]+\s+{faults}$", out, re.M), out
    assert re.search(r"^ETTR rlguard [\d.]+ \(target >= 0.85\)", out, re.M), out
    # The one fault (a kill at step 3) has its whole timeline in both ways.
    assert len(re.findall(r"step\s+3 kill.*restarted=.*first_step=", out)) == 2, out
    assert re.search(r"^callback overhead  in-callback [\d.]+ ms/step = [\d.]+%", out, re.M), out
