"""The job's control file, ``<run_dir>/control.json``: how operators stop and resume a job.

The node worker writes it (``SAFE_MODE`` after a heavy fault, ``run`` once an approver
released the job); the phase machine of every training process reads it and obeys. Each write
gets the next ``revision`` so a reader acts on a command once, and is atomic (temporary file,
fsync, rename, directory fsync): a reader sees the old command or the new one, never a mix.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from recovery._process_lock import ProcessLock
from recovery.errors import RecoveryError, RecoveryTimeout
from recovery.fsio import replace_file

__all__ = [
    "CONTROL_FILE",
    "ControlError",
    "ControlLockTimeout",
    "ControlMode",
    "ControlState",
    "read_control",
    "write_control",
]

CONTROL_FILE = "control.json"
_MAX_REASON_CHARS = 2000


class ControlError(RecoveryError):
    """The control file could not be read or written, or a value was refused."""


class ControlLockTimeout(ControlError, RecoveryTimeout):
    """Another writer held the control file's lock for longer than ``timeout``."""


class ControlMode(StrEnum):
    """What the job is told to do."""

    RUN = "run"
    SAFE_MODE = "safe_mode"


@dataclass(frozen=True)
class ControlState:
    """The current command: mode, why, and its revision (0 = never written)."""

    mode: ControlMode
    reason: str
    revision: int
    updated_at: float


def read_control(run_dir: str | os.PathLike[str]) -> ControlState:
    """The command in ``run_dir``; ``RUN`` at revision 0 when no command was ever written."""
    path = Path(run_dir) / CONTROL_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return ControlState(ControlMode.RUN, "", 0, 0.0)
    except OSError as exc:
        raise ControlError(f"cannot read {path}: {exc}") from exc
    try:
        obj = json.loads(raw)
        state = ControlState(
            mode=ControlMode(obj["mode"]),
            reason=str(obj["reason"]),
            revision=int(obj["revision"]),
            updated_at=float(obj["updated_at"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ControlError(f"{path} is not a valid control file: {exc}") from exc
    if state.revision < 1 or not math.isfinite(state.updated_at):
        raise ControlError(f"{path} is not a valid control file: revision {state.revision}")
    return state


def write_control(
    run_dir: str | os.PathLike[str],
    mode: ControlMode | str,
    reason: str,
    *,
    timeout: float = 10.0,
) -> ControlState:
    """Atomically replace the command in ``run_dir`` and return it with its new revision.

    Raises :class:`ControlError` (writing nothing) for an unknown mode, an empty or over-long
    reason or a missing ``run_dir``.
    """
    directory = Path(run_dir)
    try:
        new_mode = ControlMode(mode)
    except ValueError:
        allowed = ", ".join(m.value for m in ControlMode)
        raise ControlError(f"unknown control mode {mode!r}; expected one of {allowed}") from None
    if not isinstance(reason, str) or not reason.strip():
        raise ControlError(f"reason must be a non-empty string, got {reason!r}")
    if len(reason) > _MAX_REASON_CHARS:
        raise ControlError(f"reason is {len(reason)} characters, more than {_MAX_REASON_CHARS}")
    if not directory.is_dir():
        raise ControlError(f"run directory {str(directory)!r} does not exist")
    lock = ProcessLock(directory / (CONTROL_FILE + ".lock"), timeout_error=ControlLockTimeout)
    try:
        lock.acquire(timeout)
        try:
            previous = read_control(directory)
            state = ControlState(new_mode, reason, previous.revision + 1, time.time())
            _replace_atomically(directory, state)
        finally:
            lock.release()
    finally:
        lock.close()
    return state


def _replace_atomically(directory: Path, state: ControlState) -> None:
    body = json.dumps(
        {
            "mode": state.mode.value,
            "reason": state.reason,
            "revision": state.revision,
            "updated_at": state.updated_at,
        },
        sort_keys=True,
    ).encode()
    try:
        replace_file(directory / CONTROL_FILE, body)
    except OSError as exc:
        raise ControlError(f"cannot write {directory / CONTROL_FILE}: {exc}") from exc
