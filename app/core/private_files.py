"""The data directory is readable by its owner only.

It holds the SQLite database (password and token hashes, audit log), the SQLite broker (task
arguments), the generated secret key and the first admin's credentials. ``rlguard up`` and
``rlguard server`` call :func:`keep_private` before anything else: from then on the process and
its children create files 0600 and directories 0700 (umask 077), and what an older version or
another command (``rlguard db upgrade``) left world-readable is tightened.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from app.core.config import Settings
from app.core.db import sqlite_file

log = logging.getLogger("rlguard.files")

PRIVATE_UMASK = 0o077
_SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def keep_private(settings: Settings) -> None:
    """Set umask 077 and take group and other permissions off the data directory (0700), the
    regular files directly in it and the SQLite database wherever it is (0600)."""
    os.umask(PRIVATE_UMASK)
    if settings.data_dir.is_dir():
        _restrict(settings.data_dir)
        for entry in settings.data_dir.iterdir():
            if entry.is_file() and not entry.is_symlink():
                _restrict(entry)
    database = sqlite_file(settings.db_url)
    if database is not None:
        for path in (database, *(Path(f"{database}{s}") for s in _SQLITE_SIDE_FILES)):
            if path.is_file():
                _restrict(path)


def _restrict(path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    private = mode & ~PRIVATE_UMASK
    if private == mode:
        return
    try:
        path.chmod(private)
    except PermissionError as exc:  # someone else's file: say so, the server still runs
        log.warning("cannot make %s private (mode %o): %s", path, mode, exc.strerror)
