"""The import rules of the layout (DESIGN.md): ``recovery`` imports none of app, agents,
integrations, FastAPI, SQLModel or Celery; ``integrations`` never imports app; app never
imports agents. Checked on the source (every import statement, also inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = {
    "recovery": {"app", "agents", "integrations", "workload", "fastapi", "sqlmodel", "celery"},
    "integrations": {"app", "agents"},
    "app": {"agents"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(RULES))
def test_a_package_imports_nothing_it_must_not(package: str) -> None:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        hits = _imports(path) & RULES[package]
        if hits:
            bad.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(hits))}")
    assert bad == []
