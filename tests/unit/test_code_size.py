"""Size limits that keep the product code readable: no module over 600 lines, no function over
80 lines, and no module docstring over 20 lines or citing an issue number. Tests and vendored
static files are exempt; everything the wheel ships that is Python is checked."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# migrations/ is left out: a shipped migration is history and is never edited to fit a limit
PACKAGES = ("app", "agents", "recovery", "integrations", "workload")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# A module docstring states the module's contract; measurements and history go to docs/.
MAX_DOCSTRING_LINES = 20
ISSUE_CITATION = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


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


def test_module_docstrings_state_the_contract_briefly() -> None:
    long, citing = [], []
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        doc = ast.get_docstring(tree, clean=False)
        if doc is None:
            continue
        lines = doc.count("\n") + 1
        if lines > MAX_DOCSTRING_LINES:
            long.append(f"{rel}: {lines} lines")
        if found := ISSUE_CITATION.findall(doc):
            citing.append(f"{rel}: {', '.join(found)}")
    assert long == [], (
        f"module docstrings over {MAX_DOCSTRING_LINES} lines: keep the contract, move "
        "measurements and history to docs/"
    )
    assert citing == [], "module docstrings citing an issue: say what it means instead"


def test_the_docstring_rule_catches_what_it_should() -> None:
    # the regex is the check: a typo in it would let every citation through
    assert ISSUE_CITATION.search("was slow (issue 41 item 2)")
    assert ISSUE_CITATION.search("see Issues #7")
    assert not ISSUE_CITATION.search("verl #7155 and the foundation issue")
