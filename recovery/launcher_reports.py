"""What a process's launcher writes about it: its exit, its start, and what it declares for it.

The launcher sees a process start and exit before anyone else, and speaks for it in its
heartbeat until the process reports for itself (phase ``STARTING``) and after it exited (phase
``EXITED``, with the cause its output named). What a launcher declares for the whole life of
one process (``rlguard launch --first-step-budget``) cannot go into the heartbeat, which the
process rewrites from its own state: it goes beside it, in ``<run_dir>/launch/<role>-<rank>.json``
with the pid it is for, and the node agent reads it for that process only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from recovery.fsio import write_json_atomic
from recovery.report import (
    DONE_PHASE,
    EXITED_PHASE,
    FINISHED_PHASES,
    HEARTBEAT_FORMAT,
    STARTING_PHASE,
    HeartbeatReporter,
    _replace_heartbeat_file,
    heartbeat_path,
    read_heartbeat,
)

LAUNCH_DIRNAME = "launch"


def launch_declaration_path(run_dir: str | os.PathLike[str], role: str, rank: int) -> Path:
    """Where the launcher declares what holds for ``role``/``rank``'s current process."""
    return Path(run_dir) / LAUNCH_DIRNAME / f"{role}-{rank}.json"


def declare_launch(
    run_dir: str | os.PathLike[str],
    role: str,
    rank: int,
    *,
    pid: int,
    first_step_budget_seconds: float | None,
) -> None:
    """Declare, for the process ``pid`` of ``role``/``rank``, its first-step hang budget
    (None: the policy's). Replaced at each start: a declaration is for one process."""
    path = launch_declaration_path(run_dir, role, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(
        path,
        {"pid": pid, "first_step_budget_seconds": first_step_budget_seconds},
    )


def report_process_exit(
    run_dir: str | os.PathLike[str],
    role: str,
    rank: int,
    *,
    job: str,
    pid: int | None,
    returncode: int,
    clean_exit_phase: str = DONE_PHASE,
    clock: Callable[[], float] = time.time,
    exit_cause: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write into ``role``/``rank``'s heartbeat that its process exited; return the document.

    For the process's launcher, which sees the exit (waitpid) before anyone else: a non-zero
    exit or a signal becomes phase ``EXITED``, which the policy engine treats as lost at once.
    A clean exit (0) becomes ``clean_exit_phase`` (``DONE``: a process that chose to finish is
    not a fault; pass ``EXITED`` where a process never exits on its own), unless the process
    already wrote a finished phase itself. ``exit_code`` is the code, or minus the signal
    number as :mod:`subprocess` reports it; ``exit_signal`` names the signal. ``exit_cause``
    (cause, kind, line, source: :class:`recovery.supervision.exit_causes.ExitCause`) is why
    it failed as its own output said, when the launcher found it; an earlier exit's cause
    never stays behind. Everything else the process last wrote (step, fault counters) is kept.
    """
    path = heartbeat_path(run_dir, role, rank)
    doc = read_heartbeat(path) or {
        "format": HEARTBEAT_FORMAT,
        "job": job,
        "role": role,
        "rank": rank,
    }
    now = clock()
    doc.update(pid=pid if pid is not None else doc.get("pid"), ts=now, exit_code=returncode)
    if returncode < 0:
        try:
            doc["exit_signal"] = signal.Signals(-returncode).name
        except ValueError:
            doc["exit_signal"] = f"SIG{-returncode}"
    doc.pop("exit_cause", None)
    if exit_cause is not None and returncode != 0:
        doc["exit_cause"] = dict(exit_cause)
    if returncode != 0:
        doc["phase"] = EXITED_PHASE
    elif doc.get("phase") not in FINISHED_PHASES:
        doc["phase"] = clean_exit_phase
    _replace_heartbeat_file(path, doc)
    return doc


def report_starting(
    run_dir: str | os.PathLike[str], role: str, rank: int, *, job: str, pid: int
) -> None:
    """Write phase ``STARTING`` for a process its launcher just started, until the process
    reports for itself: a restart under way must not look like a silent participant. The fault
    counters and checkpoint version the previous process published are kept
    (:meth:`HeartbeatReporter.carry_over`), for the new process to take over in turn."""
    reporter = HeartbeatReporter(run_dir, role, rank, job=job, pid=pid)
    reporter.carry_over(read_heartbeat(heartbeat_path(run_dir, role, rank)))
    reporter.update(phase=STARTING_PHASE, force=True)
