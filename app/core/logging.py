"""Logging setup for the server and CLI: one line per record, named loggers under ``rlguard``."""

from __future__ import annotations

import logging


def configure_logging(level: str = "info") -> None:
    root = logging.getLogger()
    if any(getattr(h, "_rlguard", False) for h in root.handlers):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler._rlguard = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    logging.getLogger("rlguard").setLevel(level.upper())
