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

ROOT = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.timeout(60)


def test_help_and_imports_create_nothing_in_an_empty_cwd(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLGUARD_")}
    # `rlguard --help` as the console script runs it, after importing the task modules too (as
    # a worker does): none of it may touch the disk.
    script = (
        "import sys, app.tasks.recovery_tasks, app.tasks.alert_tasks; "
        "from app.cli import main; sys.argv = ['rlguard', '--help']; main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr.decode()
    assert b"Usage: rlguard" in r.stdout
    assert list(tmp_path.iterdir()) == []
