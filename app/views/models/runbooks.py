"""Runbooks: the Markdown pages in ``docs/runbooks/`` (one per fault kind, a few for
RLGuard's own Prometheus alerts), found by name and rendered to HTML for the dashboard.

Only names of files that exist in that folder are served (a name is looked up in the listing,
never joined onto a path), and the Markdown's raw HTML is escaped, not passed through.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

RUNBOOK_DIR = Path(__file__).resolve().parents[3] / "docs" / "runbooks"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(frozen=True, slots=True)
class Runbook:
    name: str
    title: str
    html: str


def runbook_names() -> list[str]:
    """Every runbook there is, by name (``heartbeat_lost``), sorted."""
    return sorted(p.stem for p in RUNBOOK_DIR.glob("*.md") if _NAME.fullmatch(p.stem))


def _title(text: str, name: str) -> str:
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    return first.lstrip("#").strip() if first.startswith("#") else name


@functools.lru_cache(maxsize=128)
def _rendered(name: str, mtime_ns: int) -> Runbook:
    # Keyed on the file's mtime too: an edited runbook shows without a restart.
    text = (RUNBOOK_DIR / f"{name}.md").read_text(encoding="utf-8")
    html = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    return Runbook(name=name, title=_title(text, name), html=html)


def load_runbook(name: str) -> Runbook | None:
    """The rendered runbook called ``name``; None when there is none."""
    if not _NAME.fullmatch(name) or name not in runbook_names():
        return None
    path = RUNBOOK_DIR / f"{name}.md"
    return _rendered(name, path.stat().st_mtime_ns)
