"""Drill injection points a process declares for itself, and the requests that fire them.

A generic command under ``rlguard launch`` has no way in for a fault such as ``oom``: the
launcher runs outside the process. A process that does have one (RLGuard's TRL callback:
:mod:`integrations.trl.callback`) declares it in its run directory, and the launcher's generic
:class:`recovery.supervision.drills.Injector` then asks it to fire instead of refusing.

Files, under ``<run_dir>/drill_points/``:

* ``<role>-<rank>.json``: the declaration, ``{"pid": P, "points": {fault: what it does}}``,
  written by the process itself. It counts only while ``pid`` is the process the launcher runs
  in that slot: a declaration left by an earlier process (killed, restarted) declares nothing.
* ``<role>-<rank>.<fault>.request``: written by the launcher, ``{"pid": P, "drill": ID}``. The
  process takes it by renaming it (atomic: it fires once, however often it looks), and fires it
  only when ``pid`` is its own: a request meant for a process that died before taking it is
  discarded by the next one, not fired into it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from recovery.fsio import replace_file

__all__ = ["DIRNAME", "declare", "declared_points", "request", "take"]

DIRNAME = "drill_points"


def _base(run_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    return Path(run_dir) / DIRNAME / f"{role}-{rank}"


def declare(
    run_dir: str | os.PathLike[str],
    role: str,
    rank: int,
    points: dict[str, str],
    *,
    pid: int | None = None,
) -> Path:
    """Declare this process's injection points (``{fault: what firing it does}``)."""
    path = _base(run_dir, role, rank).with_suffix(".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"pid": os.getpid() if pid is None else pid, "points": dict(points)}
    replace_file(path, json.dumps(doc).encode(), sync=False)
    return path


def declared_points(
    run_dir: str | os.PathLike[str], role: str, rank: int, pid: int
) -> dict[str, str]:
    """The points the process ``pid`` declared for ``role``/``rank`` (empty: none, or the
    declaration is an earlier process's, or unreadable)."""
    try:
        doc = json.loads(_base(run_dir, role, rank).with_suffix(".json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if (
        not isinstance(doc, dict)
        or doc.get("pid") != pid
        or not isinstance(doc.get("points"), dict)
    ):
        return {}
    return {str(k): str(v) for k, v in doc["points"].items()}


def request(
    run_dir: str | os.PathLike[str], role: str, rank: int, fault: str, *, pid: int, drill: str
) -> Path:
    """Ask the process ``pid`` to fire its ``fault`` point (once)."""
    path = Path(f"{_base(run_dir, role, rank)}.{fault}.request")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, json.dumps({"pid": pid, "drill": drill}).encode(), sync=False)
    return path


def take(
    run_dir: str | os.PathLike[str], role: str, rank: int, fault: str, *, pid: int | None = None
) -> dict[str, Any] | None:
    """Consume the request to fire ``fault``, if there is one for this process (``pid``,
    default this one): its body, else None. A request for another pid is consumed too (it was
    an earlier process's), and None is returned."""
    pid = os.getpid() if pid is None else pid
    path = Path(f"{_base(run_dir, role, rank)}.{fault}.request")
    taken = path.with_name(f"{path.name}.taken-{pid}")
    try:
        os.rename(path, taken)  # atomic: of two looks (threads, processes) one gets it
    except FileNotFoundError:
        return None
    try:
        body = json.loads(taken.read_text("utf-8"))
    except (OSError, ValueError):
        body = None
    finally:
        taken.unlink(missing_ok=True)
    if not isinstance(body, dict) or body.get("pid") != pid:
        return None
    return body
