"""The import rules of the layout (docs/architecture.md), enforced with import-linter.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``): ``recovery`` imports none of
app, agents, integrations, workload, FastAPI, SQLModel or Celery; ``app.policy`` (it decides)
imports none of the packages that act on its decisions (incidents, actions, alerts, tasks, the web
layer); ``app`` never imports ``agents``; ``integrations`` imports neither; no import cycles
between the packages and modules of ``app``. Imports inside functions count too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_import_contract_is_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint_imports), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "BROKEN" not in done.stdout
