"""The import rules of the layout (docs/architecture.md), enforced with import-linter.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``): ``recovery`` imports none of
app, agents, integrations, workload, FastAPI, SQLModel or Celery; ``app.policy`` (it decides)
imports none of the packages that act on its decisions (incidents, actions, alerts, tasks, the web
layer); ``app`` never imports ``agents``; ``integrations`` imports neither; app, agents,
integrations and workload import no ``_private`` module of ``recovery`` (only through its public
ones); no import cycles between the packages and modules of ``app``. Imports inside functions
count too.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
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


def test_the_private_module_contract_names_every_private_module_of_recovery() -> None:
    """import-linter takes no partial wildcard (``recovery._*``): the contract lists the modules,
    and a private module added to ``recovery`` must join the list."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"
    ]
    [private] = [c for c in contracts if c["name"].startswith("recovery's private modules")]
    found = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "recovery").rglob("_*.py")
        if not p.name.startswith("__")
    }
    assert set(private["forbidden_modules"]) == found
