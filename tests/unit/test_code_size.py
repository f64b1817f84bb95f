"""Size limits that keep the product code readable: no module over 600 lines and no function over
80 lines (issue 16). Tests and vendored static files are exempt; everything the wheel ships that
is Python is checked."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# migrations/ is left out: a shipped migration is history and is never edited to fit a limit
PACKAGES = ("app", "agents", "recovery", "integrations", "workload")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_the_checked_tree_is_not_empty() -> None:
    # a wrong ROOT would make both checks below pass on nothing
    assert len(_modules()) > 100


def test_no_module_is_longer_than_the_limit() -> None:
    long = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == [], f"modules over {MAX_MODULE_LINES} lines: split them by concern"


def test_no_function_is_longer_than_the_limit() -> None:
    long = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines"
                    )
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: split them"
