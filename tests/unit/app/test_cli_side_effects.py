"""Asking `rlguard` for help creates nothing in the working directory.

Every command imports the Celery app (to register `rlguard worker`); it used to be built at
import time and created ./data/ for its broker file wherever `rlguard --help` was typed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RLGUARD = str(Path(sys.executable).with_name("rlguard"))
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.timeout(60)


def test_help_and_imports_create_nothing_in_an_empty_cwd(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    for args in (["--help"], ["worker", "--help"]):
        r = subprocess.run([RLGUARD, *args], cwd=tmp_path, env=env, capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr.decode()
    # The task modules too: importing them (as a worker does) must not touch the disk.
    imports = "import app.cli, app.main, app.tasks.recovery_tasks, app.tasks.alert_tasks"
    r = subprocess.run([sys.executable, "-c", imports], cwd=tmp_path,
                       env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr.decode()
    assert list(tmp_path.iterdir()) == []
