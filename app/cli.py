"""The `rlguard` command line (filled in by the foundation work)."""
from __future__ import annotations


def main() -> None:
    raise SystemExit("rlguard: CLI not built yet")
